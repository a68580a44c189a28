// launch_fingerprint_add (input_fingerprint.cuh): one warp per row of the view's last dimension (the
// row's index decomposed once), lanes along the row, a warp sum, one atomicAdd per warp.
// Covered by tests/cuda/test_cuda_keep.cpp.
#include "cuda/input_fingerprint.cuh"

#include "core/error.h"
#include "cuda/cuda_check.cuh"

namespace kcp::cuda {
namespace {

struct FpView {
  const char* p;
  int64_t shape[4], stride[4];  // padded to rank 4 in front (extent 1)
  int64_t rows, cols;           // rows = product of the first three extents, cols = the last
  int es;                       // element bytes
};

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fingerprint_kernel(FpView v, uint64_t salt, unsigned long long* slot) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  uint64_t acc = 0;
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; r < v.rows; r += warps) {
    const int64_t i2 = r % v.shape[2], i1 = (r / v.shape[2]) % v.shape[1], i0 = r / (v.shape[2] * v.shape[1]);
    const char* row = v.p + (i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2]) * v.es;
    for (int64_t c = lane; c < v.cols; c += 32) {
      const char* e = row + c * v.stride[3] * v.es;
      const uint64_t bits = v.es == 2 ? *reinterpret_cast<const uint16_t*>(e)
                            : v.es == 4 ? *reinterpret_cast<const uint32_t*>(e)
                                        : *reinterpret_cast<const uint64_t*>(e);
      acc += mix64(uint64_t(r * v.cols + c) * 0x9E3779B97F4A7C15ull ^ (salt << 56) ^ bits);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0 && acc) atomicAdd(slot, static_cast<unsigned long long>(acc));
}

}  // namespace

void launch_fingerprint_add(const TensorView& t, uint64_t salt, unsigned long long* slot, cudaStream_t stream) {
  if (t.empty()) return;
  KCP_CHECK(t.rank() >= 1 && t.rank() <= 4, "fingerprint: expected a view of rank 1..4, got rank ", t.rank());
  FpView v;
  v.p = static_cast<const char*>(t.data);
  v.es = int(dtype_size(t.dtype));
  KCP_CHECK(v.es == 2 || v.es == 4 || v.es == 8, "fingerprint: elements of 2, 4 or 8 bytes, got ", v.es);
  const int pad = 4 - int(t.rank());
  for (int d = 0; d < 4; ++d) {
    v.shape[d] = d < pad ? 1 : t.shape[d - pad];
    v.stride[d] = d < pad ? 0 : t.stride[d - pad];
  }
  v.rows = v.shape[0] * v.shape[1] * v.shape[2], v.cols = v.shape[3];
  if (v.rows == 0 || v.cols == 0) return;  // nothing to add (and no launch of zero blocks)
  const int threads = 256;
  const int64_t want = (v.rows + threads / 32 - 1) / (threads / 32);
  const int blocks = int(want < 4096 ? want : 4096);
  fingerprint_kernel<<<blocks, threads, 0, stream>>>(v, salt, slot);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace kcp::cuda
