// Stage "gate cumsum" of gdn with the fused pre-processing (chunk_gates.cuh has the formulas):
//   beta_e[t]  = s * sigmoid(beta[t]) or beta[t];  gcum[r] = RCP_LN2 * sum_{s<=r} a[c*64+s] (per chunk)
// and, for every variant with the fused L2 norm,
//   rstd[t]    = 1 / sqrt(sum_d x[t,d]^2 + 1e-6) for q and k        (per q/k head)
// kda and gla (a gate per key) form their gate tile and beta_e inside kkt instead (scan_gate_tile),
// so for them this stage is the rstd kernel alone, or nothing.
// One block per (chunk, value head) for beta and the gates: gdn scans its 64 rows with warp
// shuffles. One block per (chunk, q/k head) for rstd, 8 threads per row. Sums are float32 (FLA: a
// parallel scan in float32 as well). Shapes: gcum [TT,HV], beta_e [TT,HV], rstd [TT,H].
// Covered by tests/cuda/test_cuda_stages.cpp ("cumsum").
#include "cuda/chunk_cumsum.cuh"
#include "cuda/chunk_gates.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128;

// gdn: one scalar gate per row; inclusive scan of 64 rows by two warps.
template <class Tg>
__device__ void scan_rows(const ChunkParams& p, const ChunkInfo& ck, int hv, float rate) {
  __shared__ float warp0_total;
  const int r = threadIdx.x, lane = r & 31;
  if (r >= kChunk) return;
  float x = r < ck.len ? gate_value(p, static_cast<const Tg*>(p.g.p), row_off(p.g, ck.t0 + r, hv), dt_bias_of(p, hv), rate) : 0.0f;
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (r == 31) warp0_total = x;
  asm volatile("bar.sync 1, 64;");  // the two warps of the scan only
  if (r >= 32) x += warp0_total;
  if (r < ck.len) p.gcum[int64_t(ck.t0 + r) * p.HV + hv] = kRcpLn2 * x;
}

template <class Tg>
__global__ void __launch_bounds__(kThreads) chunk_cumsum_kernel(const ChunkParams p) {
  const ChunkInfo ck = chunk_at(p, blockIdx.x);
  const int hv = blockIdx.y;
  for (int r = threadIdx.x; r < ck.len; r += kThreads) p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] = effective_beta(p, ck.t0 + r, hv);
  scan_rows<Tg>(p, ck, hv, gate_rate(p, hv));
}

// rstd of the q and k rows of one chunk and q/k head: 8 threads per row, 16 rows per pass.
template <class Tin, int KD>
__global__ void __launch_bounds__(kThreads) qk_rstd_kernel(const ChunkParams p) {
  const ChunkInfo ck = chunk_at(p, blockIdx.x);
  const int h = blockIdx.y, part = threadIdx.x & 7;
  for (int r = threadIdx.x >> 3; r < ck.len; r += kThreads / 8) {
    const Tin* q = static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0 + r, h);
    const Tin* k = static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0 + r, h);
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int i = 0; i < KD / 8; ++i) {
      const float a = to_float(q[part + 8 * i]), b = to_float(k[part + 8 * i]);
      sq += a * a, sk += b * b;
    }
    for (int o = 1; o < 8; o <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o), sk += __shfl_xor_sync(0xffffffffu, sk, o);
    if (part == 0) {
      p.rstd_q[int64_t(ck.t0 + r) * p.H + h] = 1.0f / sqrtf(sq + 1e-6f);
      p.rstd_k[int64_t(ck.t0 + r) * p.H + h] = 1.0f / sqrtf(sk + 1e-6f);
    }
  }
}

}  // namespace

void launch_chunk_cumsum(const ChunkParams& p, int input_dtype, cudaStream_t stream) {
  if (p.NT == 0) return;
  auto gates = [&](auto tag) {
    using Tg = typename decltype(tag)::type;
    chunk_cumsum_kernel<Tg><<<dim3(p.NT, p.HV), kThreads, 0, stream>>>(p);
    KCP_CUDA_LAUNCH_CHECK();
  };
  if (!p.kda) {  // kda, gla: the gate tile and beta are formed by kkt (chunk_gates.cuh)
    if (p.g.dt == kF64) gates(TypeTag<double>{});
    else dispatch_input_type(p.g.dt, gates);
  }
  if (!p.l2norm) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      qk_rstd_kernel<Tin, decltype(kd)::value><<<dim3(p.NT, p.H), kThreads, 0, stream>>>(p);
      KCP_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace kcp::cuda
