// merge_transitions(): one block per (value head, 32-column slice of S), the slice of S [K,32] kept
// in shared memory; each step S = M_j @ S + S_ext_j with exact float32 FMAs (the CP chain must stay
// float32: rounding M or S to 16 bits compounds over ranks, ALGORITHMS.md 5.6).
// Covered by tests/cuda/test_cuda_transition.cpp ("merge").
#include "cuda/cp_transition.h"

#include "cuda/cuda_check.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128, kCols = 32;

__global__ void __launch_bounds__(kThreads) merge_kernel(const float* __restrict__ m, const float* __restrict__ s_ext,
                                                         int64_t first, int64_t count, const float* __restrict__ s0,
                                                         float* __restrict__ out, int HV, int K, int V) {
  extern __shared__ float sm[];  // S [K][kCols], then the new S [K][kCols]
  float* S = sm;
  float* Sn = sm + K * kCols;
  const int hv = blockIdx.x, c0 = kCols * blockIdx.y, c = threadIdx.x % kCols, r0 = threadIdx.x / kCols;
  constexpr int kRowStep = kThreads / kCols;
  for (int i = r0; i < K; i += kRowStep) S[i * kCols + c] = s0 ? s0[(int64_t(hv) * K + i) * V + c0 + c] : 0.0f;
  __syncthreads();
  for (int64_t j = first; j < first + count; ++j) {
    const float* Mj = m + (j * HV + hv) * K * K;
    const float* Xj = s_ext + (j * HV + hv) * K * V;
    for (int i = r0; i < K; i += kRowStep) {
      float acc = Xj[int64_t(i) * V + c0 + c];
      for (int q = 0; q < K; ++q) acc = fmaf(Mj[int64_t(i) * K + q], S[q * kCols + c], acc);
      Sn[i * kCols + c] = acc;
    }
    __syncthreads();
    for (int i = r0; i < K; i += kRowStep) S[i * kCols + c] = Sn[i * kCols + c];
    __syncthreads();
  }
  for (int i = r0; i < K; i += kRowStep) out[(int64_t(hv) * K + i) * V + c0 + c] = S[i * kCols + c];
}

void expect_f32_device(const TensorView& t, const char* name) {
  KCP_CHECK(t.device == Device::cuda && t.dtype == DType::f32 && t.contiguous(), "merge_transitions: ", name,
            " must be a contiguous float32 CUDA view");
}

}  // namespace

void merge_transitions(const TensorView& m, const TensorView& s_ext, int64_t first, int64_t count,
                       const TensorView& s0, const TensorView& out) {
  expect_f32_device(m, "m"), expect_f32_device(s_ext, "s_ext"), expect_f32_device(out, "out");
  KCP_CHECK(m.rank() == 4 && s_ext.rank() == 4 && out.rank() == 3, "merge_transitions: expected m [P,HV,K,K], "
            "s_ext [P,HV,K,V], out [HV,K,V]");
  const int64_t P = m.dim(0), HV = m.dim(1), K = m.dim(2), V = s_ext.dim(3);
  KCP_CHECK(m.dim(3) == K && s_ext.shape == Shape({P, HV, K, V}) && out.shape == Shape({HV, K, V}),
            "merge_transitions: shapes disagree: m ", shape_str(m.shape), ", s_ext ", shape_str(s_ext.shape), ", out ",
            shape_str(out.shape));
  KCP_CHECK(first >= 0 && count >= 0 && first + count <= P, "merge_transitions: range [", first, ", ", first + count,
            ") outside [0, ", P, ")");
  KCP_CHECK(V % kCols == 0, "merge_transitions: V = ", V, " must be a multiple of ", kCols);
  if (!s0.empty()) {
    expect_f32_device(s0, "s0");
    KCP_CHECK(s0.shape == out.shape, "merge_transitions: s0 must be [HV,K,V] like out");
  }
  if (HV == 0) return;
  const size_t smem = sizeof(float) * 2 * size_t(K) * kCols;
  launch_kernel(merge_kernel, dim3(unsigned(HV), unsigned(V / kCols)), kThreads, smem, cudaStream_t{},
                static_cast<const float*>(m.data), static_cast<const float*>(s_ext.data), first, count,
                static_cast<const float*>(s0.data), static_cast<float*>(out.data), int(HV), int(K), int(V));
}

}  // namespace kcp::cuda
