// StagedComm: MPI on device buffers through pinned host staging (see comm_device.h), and the choice
// of the data communicator.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "cp/comm_device.h"
#include "cp/comm_host_controlled.h"
#include "cp/comm_mpi.h"

namespace kcp::cp {
namespace {

// A pinned host buffer of a queue, grown on demand.
class Staging {
 public:
  explicit Staging(Queue& q) : q_(q) {}
  ~Staging() {
    if (p_) q_.release_host(p_);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      if (p_) q_.release_host(p_);
      p_ = nullptr;
      p_ = q_.alloc_host(bytes);
      bytes_ = bytes;
    }
    return p_;
  }

 private:
  Queue& q_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class StagedComm final : public HostControlledComm<StagedComm> {
 public:
  StagedComm(Comm& host, Queue& q) : HostControlledComm(host, q), a_(q), b_(q) {}
  std::string_view name() const override { return "mpi-staged"; }
  Device device() const override { return q_.device(); }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t n = bytes(count, dtype);
    void* hs = to_host(a_, send, n);
    void* hr = b_.get(n * size_t(size()));
    host_.all_gather(hs, hr, count, dtype);
    q_.copy(recv, hr, n * size_t(size()), CopyKind::host_to_device);
    q_.synchronize();  // the staging buffer is reused by the next call
  }
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    const size_t n = bytes(count, dtype);
    void* h = to_host(a_, buf, n);
    host_.all_reduce(h, count, dtype, op);
    q_.copy(buf, h, n, CopyKind::host_to_device);
    q_.synchronize();
  }
  void send(const void* buf, int64_t count, DType dtype, int dst, int tag) override {
    host_.send(to_host(a_, buf, bytes(count, dtype)), count, dtype, dst, tag);
  }
  void recv(void* buf, int64_t count, DType dtype, int src, int tag) override {
    const size_t n = bytes(count, dtype);
    void* h = b_.get(n);
    host_.recv(h, count, dtype, src, tag);
    q_.copy(buf, h, n, CopyKind::host_to_device);
    q_.synchronize();
  }
  void send_recv(const void* send, int dst, void* recv, int src, int64_t count, DType dtype, int tag) override {
    const size_t n = bytes(count, dtype);
    void* hs = dst == kNoRank ? a_.get(n) : to_host(a_, send, n);
    void* hr = b_.get(n);
    host_.send_recv(hs, dst, hr, src, count, dtype, tag);
    if (src == kNoRank) return;
    q_.copy(recv, hr, n, CopyKind::host_to_device);
    q_.synchronize();
  }

 private:
  static size_t bytes(int64_t count, DType dt) {
    KCP_CHECK(count >= 0, "staged comm: negative element count ", count);
    return size_t(count) * size_t(dtype_size(dt));
  }
  void* to_host(Staging& s, const void* dev, size_t n) {
    void* h = s.get(n);
    q_.copy(h, dev, n, CopyKind::device_to_host);
    q_.synchronize();
    return h;
  }
  Staging a_, b_;
};

}  // namespace

std::unique_ptr<Comm> make_staged_comm(Comm& host, Queue& queue) {
  KCP_CHECK(host.device() == Device::host, "make_staged_comm: the control communicator must work on host memory");
  return std::make_unique<StagedComm>(host, queue);
}

CommKind comm_kind_parse(std::string_view s) {
  if (s == "auto") return CommKind::automatic;
  if (s == "mpi") return CommKind::mpi;
  if (s == "nccl") return CommKind::nccl;
  throw Error(detail::concat("--comm: expected auto, mpi or nccl, got '", s, "'"));
}

int64_t nccl_spin_us_parse(const char* value) {
  if (!value || !*value) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  KCP_CHECK(std::isdigit(static_cast<unsigned char>(value[0])) && *end == '\0' && v <= 10000000,
            "KCP_NCCL_SPIN_US: expected microseconds, an integer in [0, 10000000], got '", value, "'");
  return v;
}

DataComm make_data_comm(Comm& host, Queue& queue, CommKind kind, int gpus_on_host) {
  DataComm d;
  if (queue.device() == Device::host) {
    KCP_CHECK(kind != CommKind::nccl, "--comm nccl: the backend computes on the host; NCCL needs a CUDA backend "
              "(use --comm mpi)");
    d.comm = &host;
    return d;
  }
  const bool own_gpu = local_size() <= gpus_on_host;
  if (kind == CommKind::nccl) {
    KCP_CHECK(nccl_available(), "--comm nccl: this build has no NCCL (configure with NCCL found; use --comm mpi)");
    KCP_CHECK(own_gpu, "--comm nccl: ", local_size(), " ranks on this host but ", gpus_on_host,
              " GPU(s): NCCL needs one GPU per rank (use --comm mpi to share GPUs)");
  }
  const bool nccl = kind == CommKind::nccl || (kind == CommKind::automatic && nccl_available() && own_gpu);
  d.owned = nccl ? make_nccl_comm(host, queue) : make_staged_comm(host, queue);
  d.comm = d.owned.get();
  return d;
}

}  // namespace kcp::cp
