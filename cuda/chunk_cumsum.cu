// Stage "gate cumsum" with the fused pre-processing, one block per (chunk, value head):
//   beta_e[t]  = s * sigmoid(beta[t])  (s = 2 with allow_neg_eigval) or beta[t]
//   a[t,d]     = gate(g[t,d] + dt_bias[d]) or g[t,d]                (device_math.cuh)
//   gcum[r,d]  = RCP_LN2 * sum_{s<=r} a[c*64+s, d]                   (restarts at every chunk)
//   rstd[t]    = 1 / sqrt(sum_d x[t,d]^2 + 1e-6) for q and k        (l2norm only, per q/k head)
// The sum is sequential in float32 (FLA uses a parallel scan; both are float32 sums of <= 64 terms).
// Shapes: gcum [TT,HV,Kg] (Kg = K for kda, 1 for gdn), beta_e [TT,HV], rstd_q/k [TT,H].
// Covered by tests/cuda/test_cuda_stages.cpp ("cumsum").
#include "cuda/chunk_cumsum.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128;

__device__ void beta_rows(const ChunkParams& p, const ChunkInfo& ck, int hv) {
  for (int r = threadIdx.x; r < ck.len; r += kThreads) {
    float b = load_any(p.beta.p, p.beta.dt, row_off(p.beta, ck.t0 + r, hv));
    if (p.beta_sigmoid) b = p.beta_scale * sigmoid_f(b);
    p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] = b;
  }
}

// a[r][d] for the chunk's rows into shared memory, then one thread per channel sums down the rows.
__device__ void gate_cumsum(const ChunkParams& p, const ChunkInfo& ck, int hv, float* a_s) {
  const int Kg = p.kda ? p.K : 1;
  float rate = 1.0f;
  if (p.A_log.p) rate = expf(load_any(p.A_log.p, p.A_log.dt, hv * p.A_log.s));
  for (int idx = threadIdx.x; idx < ck.len * Kg; idx += kThreads) {
    const int r = idx / Kg, d = idx - r * Kg;
    float x = load_any(p.g.p, p.g.dt, row_off(p.g, ck.t0 + r, hv) + d);
    if (p.gate != kGateLogDecay) {
      if (p.dt_bias.p) x += load_any(p.dt_bias.p, p.dt_bias.dt, int64_t(hv * Kg + d) * p.dt_bias.s);
      x = gate_activate(p.gate, x, rate, p.lower_bound);
    }
    a_s[idx] = x;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < Kg; d += kThreads) {
    float acc = 0.0f;
    for (int r = 0; r < ck.len; ++r) {
      acc += a_s[r * Kg + d];
      p.gcum[(int64_t(ck.t0 + r) * p.HV + hv) * Kg + d] = kRcpLn2 * acc;
    }
  }
}

// One warp per row: rstd = 1/sqrt(sum x^2 + 1e-6), FLA's l2norm_fwd in float32.
template <class Tin>
__device__ void row_rstd(const RowsView& x, const ChunkInfo& ck, int h, int K, int H, float* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Tin* base = static_cast<const Tin*>(x.p);
  for (int r = warp; r < ck.len; r += kThreads / 32) {
    const Tin* row = base + row_off(x, ck.t0 + r, h);
    float s = 0.0f;
    for (int d = lane; d < K; d += 32) {
      const float v = to_float(row[d]);
      s += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[int64_t(ck.t0 + r) * H + h] = 1.0f / sqrtf(s + 1e-6f);
  }
}

template <class Tin>
__global__ void __launch_bounds__(kThreads) chunk_cumsum_kernel(const ChunkParams p) {
  extern __shared__ float a_s[];  // [64][Kg]
  const ChunkInfo ck = p.chunks[blockIdx.x];
  const int hv = blockIdx.y;
  beta_rows(p, ck, hv);
  gate_cumsum(p, ck, hv, a_s);
  if (p.l2norm && hv % p.G == 0) {  // q/k rows are shared by the G value heads of a group
    row_rstd<Tin>(p.q, ck, hv / p.G, p.K, p.H, p.rstd_q);
    row_rstd<Tin>(p.k, ck, hv / p.G, p.K, p.H, p.rstd_k);
  }
}

}  // namespace

void launch_chunk_cumsum(const ChunkParams& p, int input_dtype, cudaStream_t stream) {
  if (p.NT == 0) return;
  const size_t smem = sizeof(float) * kChunk * (p.kda ? p.K : 1);
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    chunk_cumsum_kernel<Tin><<<dim3(p.NT, p.HV), kThreads, smem, stream>>>(p);
    KCP_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace kcp::cuda
