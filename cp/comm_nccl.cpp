// NcclComm: NCCL on the queue's device and stream (see comm_device.h). Built when nccl.h is found
// (cp/CMakeLists.txt); comm_nccl_none.cpp stands in otherwise. libnccl.so.2 is loaded at run time
// (dlopen; KCP_NCCL_LIBRARY overrides the name), so the kcp programs start on machines without NCCL
// and --comm nccl says what is missing. Supported dtypes: float32, float64, int32, int64 (what the
// CP layer moves). Every call enqueues on the stream, then waits for the stream by polling under a
// Watch, so a peer that stopped answering ends the job (watchdog.h). The poll sleeps 50 us between
// queries; KCP_NCCL_SPIN_US=N polls without sleeping for the first N microseconds of a wait (the
// exchange at N = 2 took 0.31 ms for ~2 MiB, more than its transfer: docs/CP.md; default 0, unmeasured).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cp/comm_device.h"
#include "cp/comm_host_controlled.h"
#include "cp/comm_mpi.h"
#include "cp/watchdog.h"

namespace kcp::cp {
namespace {

// KCP_NCCL_SPIN_US (comm_device.h nccl_spin_us_parse), read once.
std::chrono::microseconds spin_window() {
  static const int64_t us = nccl_spin_us_parse(std::getenv("KCP_NCCL_SPIN_US"));
  return std::chrono::microseconds(us);
}

// The NCCL entry points kcp uses, resolved from the shared library once.
struct NcclApi {
  std::string error;  // why NCCL cannot be used; empty when every symbol was found
  decltype(&::ncclGetErrorString) ncclGetErrorString = nullptr;
  decltype(&::ncclGetLastError) ncclGetLastError = nullptr;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) ncclCommInitRank = nullptr;
  decltype(&::ncclCommDestroy) ncclCommDestroy = nullptr;
  decltype(&::ncclCommAbort) ncclCommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) ncclCommGetAsyncError = nullptr;
  decltype(&::ncclAllGather) ncclAllGather = nullptr;
  decltype(&::ncclAllReduce) ncclAllReduce = nullptr;
  decltype(&::ncclSend) ncclSend = nullptr;
  decltype(&::ncclRecv) ncclRecv = nullptr;
  decltype(&::ncclGroupStart) ncclGroupStart = nullptr;
  decltype(&::ncclGroupEnd) ncclGroupEnd = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    const char* env = std::getenv("KCP_NCCL_LIBRARY");
    const char* name = env && *env ? env : "libnccl.so.2";
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      a.error = detail::concat("cannot load ", name, " (", dlerror(), "); put NCCL's library directory on "
                               "LD_LIBRARY_PATH or set KCP_NCCL_LIBRARY");
      return a;
    }
    auto load = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
      if (!fn && a.error.empty()) a.error = detail::concat(name, " has no symbol ", sym);
    };
    load(a.ncclGetErrorString, "ncclGetErrorString"), load(a.ncclGetLastError, "ncclGetLastError");
    load(a.ncclGetUniqueId, "ncclGetUniqueId"), load(a.ncclCommInitRank, "ncclCommInitRank");
    load(a.ncclCommDestroy, "ncclCommDestroy"), load(a.ncclCommAbort, "ncclCommAbort");
    load(a.ncclCommGetAsyncError, "ncclCommGetAsyncError"), load(a.ncclAllGather, "ncclAllGather");
    load(a.ncclAllReduce, "ncclAllReduce"), load(a.ncclSend, "ncclSend"), load(a.ncclRecv, "ncclRecv");
    load(a.ncclGroupStart, "ncclGroupStart"), load(a.ncclGroupEnd, "ncclGroupEnd");
    return a;
  }();
  return api;
}

void nccl_check(ncclResult_t r, const char* call) {
  KCP_CHECK(r == ncclSuccess, call, " failed: ", nccl().ncclGetErrorString(r), " (", nccl().ncclGetLastError(nullptr),
            ")");
}
void cuda_check(cudaError_t e, const char* call) {
  KCP_CHECK(e == cudaSuccess, call, " failed: ", cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f64: return ncclFloat64;
    case DType::f32: return ncclFloat32;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: break;
  }
  throw Error(detail::concat("nccl comm: dtype ", dtype_name(t), " is not supported (float64, float32, int32, int64)"));
}

// Live communicators, aborted before a job abort so that no rank stays in a device collective.
std::mutex g_live_mutex;
std::vector<ncclComm_t> g_live;

class NcclComm final : public HostControlledComm<NcclComm> {
 public:
  NcclComm(Comm& host, Queue& q) : HostControlledComm(host, q), stream_(static_cast<cudaStream_t>(q.native_stream())) {
    KCP_CHECK(q.device() == Device::cuda, "nccl comm: the backend's queue must be a CUDA device, got ", q.describe());
    ncclUniqueId id{};
    if (host.rank() == 0) nccl_check(nccl().ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<char> all(sizeof id * size_t(host.size()));
    host.all_gather(&id, all.data(), int64_t(sizeof id / sizeof(int32_t)), DType::i32);  // rank 0's id is first
    std::memcpy(&id, all.data(), sizeof id);
    cuda_check(cudaSetDevice(q.device_index()), "cudaSetDevice");
    nccl_check(nccl().ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
    std::lock_guard<std::mutex> lock(g_live_mutex);
    static const bool hooked = (on_abort([] {
                                  std::lock_guard<std::mutex> l(g_live_mutex);
                                  for (ncclComm_t c : g_live) nccl().ncclCommAbort(c);
                                  g_live.clear();
                                }),
                                true);
    (void)hooked;
    g_live.push_back(comm_);
  }
  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      std::erase(g_live, comm_);
    }
    nccl().ncclCommDestroy(comm_);  // destructor: nothing to report to
  }
  std::string_view name() const override { return "nccl"; }
  Device device() const override { return Device::cuda; }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    nccl_check(nccl().ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, stream_), "ncclAllGather");
    wait("ncclAllGather");
  }
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    nccl_check(nccl().ncclAllReduce(buf, buf, size_t(count), nccl_type(dtype), op == ReduceOp::sum ? ncclSum : ncclMax, comm_,
                             stream_),
               "ncclAllReduce");
    wait("ncclAllReduce");
  }
  void send(const void* buf, int64_t count, DType dtype, int dst, int) override {
    nccl_check(nccl().ncclSend(buf, size_t(count), nccl_type(dtype), dst, comm_, stream_), "ncclSend");
    wait("ncclSend");
  }
  void recv(void* buf, int64_t count, DType dtype, int src, int) override {
    nccl_check(nccl().ncclRecv(buf, size_t(count), nccl_type(dtype), src, comm_, stream_), "ncclRecv");
    wait("ncclRecv");
  }
  void send_recv(const void* send, int dst, void* recv, int src, int64_t count, DType dtype, int) override {
    nccl_check(nccl().ncclGroupStart(), "ncclGroupStart");
    if (dst != kNoRank) nccl_check(nccl().ncclSend(send, size_t(count), nccl_type(dtype), dst, comm_, stream_), "ncclSend");
    if (src != kNoRank) nccl_check(nccl().ncclRecv(recv, size_t(count), nccl_type(dtype), src, comm_, stream_), "ncclRecv");
    nccl_check(nccl().ncclGroupEnd(), "ncclGroupEnd");
    wait("ncclSend/ncclRecv");
  }

 private:
  // Waits for the stream (where the collective runs) under the watchdog; polls so a stopped peer
  // is caught by the watchdog thread rather than blocking inside the driver.
  void wait(const char* what) {
    Watch w(what);
    const auto spin_until = std::chrono::steady_clock::now() + spin_window();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      KCP_CHECK(e == cudaErrorNotReady, what, ": ", cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      nccl_check(nccl().ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      nccl_check(async, what);
      if (std::chrono::steady_clock::now() >= spin_until) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_available() { return nccl().error.empty(); }

std::unique_ptr<Comm> make_nccl_comm(Comm& host, Queue& queue) {
  KCP_CHECK(host.device() == Device::host, "make_nccl_comm: the control communicator must work on host memory");
  KCP_CHECK(nccl_available(), "nccl comm: ", nccl().error);
  spin_window();  // a bad KCP_NCCL_SPIN_US is reported here, before any collective is enqueued
  return std::make_unique<NcclComm>(host, queue);
}

}  // namespace kcp::cp
