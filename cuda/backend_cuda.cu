// CudaChunkwiseBackend: the Backend interface over Pipeline (chunkwise.h), plus device memory
// hooks (cudaMalloc / cudaMemcpy on the default stream) and CUDA-event timing for `kcp bench`.
// Covered by tests/cuda/test_cuda_backend.cpp.
#include "cuda/backend_cuda.h"

#include "cuda/chunkwise.h"
#include "cuda/cuda_check.cuh"
#include "cuda/key_dims.h"

namespace kcp::cuda {
namespace {

constexpr const char* kNoBackward = "cuda-chunkwise: backward is not implemented yet";

class CudaChunkwiseBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda-chunkwise"; }
  Device device() const override { return Device::cuda; }

  Support supports(const Problem& p) const override {
    if (p.variant == Variant::gla) return Support::no("gla is not implemented on the GPU (gdn and kda are)");
    if (p.chunk_size != 64) return Support::no(detail::concat("chunk_size ", p.chunk_size, ": the kernels use 64"));
    if (!key_dim_supported(p.K)) return Support::no(detail::concat("K = ", p.K, ": instantiated for K = 32, 64, 128"));
    if (p.V % kValueTile != 0) return Support::no(detail::concat("V = ", p.V, ": must be a multiple of ", kValueTile));
    if (p.compute != DType::f32) return Support::no("computes in float32 only (ask for compute = float32)");
    return {};
  }

  Support supports_backward(const Problem&) const override { return Support::no(kNoBackward); }

  void forward(const Problem& p, const Inputs& in, const Outputs& out) override {
    require_support(*this, p);
    pipeline_.forward(p, in, out);
  }
  void backward(const Problem&, const Inputs&, const Cotangents&, const Grads&) override { throw Error(kNoBackward); }
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq, const Transition& tr) override {
    require_support(*this, p);
    pipeline_.transition_forward(p, in, seq, tr);
  }
  void transition_backward(const Problem&, const Inputs&, const TensorView&, int64_t, const Transition&) override {
    throw Error(kNoBackward);
  }
  void synchronize() override { KCP_CUDA_CHECK(cudaDeviceSynchronize()); }

  void* alloc(size_t bytes) override {
    KCP_CHECK(device_count() > 0, "cuda-chunkwise: no CUDA device is available");
    void* p = nullptr;
    if (bytes) KCP_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void release(void* ptr) override { cudaFree(ptr); }  // called from destructors: must not throw
  void upload(void* dst, const void* src, size_t bytes) override {
    KCP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    KCP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

 private:
  Pipeline pipeline_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaChunkwiseBackend>(); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

double elapsed_ms(const std::function<void()>& body) {
  cudaEvent_t start, stop;
  KCP_CUDA_CHECK(cudaEventCreate(&start));
  KCP_CUDA_CHECK(cudaEventCreate(&stop));
  KCP_CUDA_CHECK(cudaEventRecord(start, 0));
  body();
  KCP_CUDA_CHECK(cudaEventRecord(stop, 0));
  KCP_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KCP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  KCP_CUDA_CHECK(cudaEventDestroy(start));
  KCP_CUDA_CHECK(cudaEventDestroy(stop));
  return double(ms);
}

}  // namespace kcp::cuda
