// CudaQueue: the CUDA execution context (queue_cuda.h). Each method makes the queue's device current
// for its duration (DeviceGuard), so queues on different devices can be used from one thread.
#include "cuda/queue_cuda.h"

#include <cstdio>

#include "cuda/cuda_check.cuh"
#include "cuda/device_guard.cuh"
#include "cuda/queue_ops.cuh"

namespace kcp::cuda {
namespace {

class CudaQueue final : public Queue {
 public:
  explicit CudaQueue(const CudaQueueOptions& opt) {
    KCP_CHECK(device_count() > 0, "cuda: no CUDA device is available");
    if (opt.device < 0) KCP_CUDA_CHECK(cudaGetDevice(&device_));
    else device_ = opt.device;
    KCP_CHECK(device_ < device_count(), "cuda: device ", device_, " does not exist (", device_count(), " visible)");
    DeviceGuard g(device_);
    if (opt.stream) {
      stream_ = static_cast<cudaStream_t>(opt.stream);
    } else {
      KCP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      owns_ = true;
    }
    cudaDeviceProp prop{};
    KCP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;
    sms_ = prop.multiProcessorCount;
  }
  ~CudaQueue() override {
    if (!owns_) return;
    DeviceGuard g(device_, std::nothrow);
    cudaStreamSynchronize(stream_);  // destructor: nothing to report to, the work is abandoned either way
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda; }
  std::string describe() const override {
    char buf[64];
    std::snprintf(buf, sizeof buf, " stream %p", static_cast<void*>(stream_));
    return "cuda:" + std::to_string(device_) + " (" + name_ + ")" + buf;
  }
  int device_index() const override { return device_; }
  void* native_stream() const override { return stream_; }
  int multiprocessor_count() const override { return sms_; }
  int64_t device_memory_used() const override {
    DeviceGuard g(device_);
    size_t free = 0, total = 0;
    KCP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return int64_t(total - free);
  }

  void* alloc(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::concat("cuda:", device_, ": cannot allocate ", bytes, " bytes of device memory (",
                                 cudaGetErrorString(e), ")"));
    }
    return p;
  }
  void release(void* ptr) noexcept override {
    DeviceGuard g(device_, std::nothrow);
    cudaFree(ptr);  // called from destructors: must not throw
  }
  void* alloc_host(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    KCP_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
  }
  void release_host(void* ptr) noexcept override { cudaFreeHost(ptr); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) override {
    if (!bytes) return;
    DeviceGuard g(device_);
    const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                             : kind == CopyKind::device_to_device ? cudaMemcpyDeviceToDevice
                                                                  : cudaMemcpyHostToHost;
    KCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, stream_));
  }
  void synchronize() override {
    DeviceGuard g(device_);
    KCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  double time_ms(const std::function<void()>& body) override {
    DeviceGuard g(device_);
    cudaEvent_t start, stop;
    KCP_CUDA_CHECK(cudaEventCreate(&start));
    KCP_CUDA_CHECK(cudaEventCreate(&stop));
    KCP_CUDA_CHECK(cudaEventRecord(start, stream_));
    body();
    KCP_CUDA_CHECK(cudaEventRecord(stop, stream_));
    KCP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KCP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start), cudaEventDestroy(stop);
    return double(ms);
  }

  void copy_view(const TensorView& dst, const TensorView& src) override { view_op(ViewOp::copy, dst, src); }
  void add_view(const TensorView& dst, const TensorView& src) override { view_op(ViewOp::add, dst, src); }
  void fill_zero(const TensorView& dst) override { view_op(ViewOp::zero, dst, dst); }
  void pad_view(const TensorView& dst, const TensorView& src) override {
    DeviceGuard g(device_);
    launch_pad_view(dst, src, stream_);
  }

  void transition_fold(const TensorView& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0,
                       const TensorView& out) override {
    DeviceGuard g(device_);
    const DeviceTensor x = compute_copy(x0, elems.dtype);
    launch_transition_fold(elems, first, count, reverse, x.view.empty() ? x0 : x.view, out, stream_);
  }
  void transition_scan(const TensorView& elems, const std::vector<TransitionRange>& ranges,
                       const TensorView& out) override {
    DeviceGuard g(device_);
    launch_transition_scan(elems, ranges, out, stream_);
  }
  void transition_compose(const TensorView& later, const TensorView& earlier, const TensorView& out) override {
    DeviceGuard g(device_);
    launch_transition_compose(later, earlier, out, stream_);
  }
  void transition_start(const TensorView& t, const TensorView& x0) override {
    DeviceGuard g(device_);
    const DeviceTensor x = compute_copy(x0, t.dtype);
    launch_transition_start(t, x.view.empty() ? x0 : x.view, stream_);
  }
  void transition_identity(const TensorView& t) override {
    DeviceGuard g(device_);
    launch_transition_identity(t, stream_);
  }

 private:
  // The kernels read a state x0 in the transition's precision, rows contiguous. A state as the user
  // holds it (bf16 or float32 beside a float64 transition; [V,K] storage seen K-major through strides,
  // core/transition.h state_entry_kmajor) is converted into such a copy first, as the host queue does.
  // Empty when x0 already fits (or is absent). Released after the kernel is enqueued: cudaFree waits.
  DeviceTensor compute_copy(const TensorView& x0, DType dtype) {
    if (x0.empty() || (x0.dtype == dtype && x0.contiguous())) return {};
    DeviceTensor x(*this, dtype, x0.shape);
    copy_view(x.view, x0);
    return x;
  }
  void view_op(ViewOp op, const TensorView& dst, const TensorView& src) {
    DeviceGuard g(device_);
    launch_view_op(op, dst, src, stream_);
  }
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool owns_ = false;
  std::string name_;
  int sms_ = 0;
};

}  // namespace

std::unique_ptr<Queue> make_cuda_queue(const CudaQueueOptions& opt) { return std::make_unique<CudaQueue>(opt); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace kcp::cuda
