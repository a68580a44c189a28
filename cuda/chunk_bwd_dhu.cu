// Backward stage "dhu" (FLA chunk_gated_delta_rule_bwd_dhu; CPU twin chunk_bwd_dAv +
// chunk_state_backward): one block of 256 threads per (sequence n, value head hv, 32 state columns
// [v0, v0+32)), walking the chunks of n last to first with dh [K,32] in shared memory:
//   dh[c]  = dh                                        (kept for the chunk stage)
//   dvnew  = Aqk^T do + kg dh           [L,32]         kg_r = kn_r * 2^(b_end - b_r)
//   dh    <- Diag(2^b_end) dh + scale qg^T do - w^T dvnew,   qg_r = qn_r * 2^(b_r)
// (b: the chunk-local gate cumsum in log2 units, per channel for kda; every exponent <= 0.)
// dh starts from d_final_state (or 0), or from the identity for the CP transition's M^T (do = 0,
// Vw = K); after chunk 0 it is written to dh0. Straightforward float32 FMA loops (no tensor cores).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 256, kBV = 32;

struct DhuSmem {
  float *dh, *dO, *dvn, *gs;  // [KD][32], [64][32], [64][32], [64][Kg]
};

__device__ __forceinline__ float gate_at(const ChunkParams& p, const float* gs, int r, int d) {
  return p.kda ? gs[r * p.K + d] : gs[r];
}

// Loads do (zero without it) and the gates of chunk ck into shared memory.
__device__ void load_chunk(const BwdParams& bp, const ChunkInfo& ck, int hv, int v0, const DhuSmem& s) {
  const ChunkParams& p = bp.c;
  const int L = ck.len, Kg = p.kda ? p.K : 1;
  for (int idx = threadIdx.x; idx < kChunk * kBV; idx += kThreads) {
    const int r = idx / kBV, j = idx % kBV;
    s.dO[idx] = (bp.d_o.p && r < L) ? load_any(bp.d_o.p, bp.d_o.dt, row_off(bp.d_o, ck.t0 + r, hv) + v0 + j) : 0.0f;
  }
  for (int idx = threadIdx.x; idx < L * Kg; idx += kThreads)
    s.gs[idx] = p.gcum[(int64_t(ck.t0) * p.HV + hv) * Kg + int64_t(idx / Kg) * p.HV * Kg + idx % Kg];
}

// dvnew = Aqk^T do + kg dh for the chunk's rows (into shared memory and, when kept, the workspace).
__device__ void form_dvnew(const BwdParams& bp, const ChunkInfo& ck, int c, int hv, int v0, const DhuSmem& s) {
  const ChunkParams& p = bp.c;
  const int L = ck.len, h = hv / p.G;
  const float* Aqk = p.Aqk + (int64_t(c) * p.HV + hv) * kChunk * kChunk;
  for (int idx = threadIdx.x; idx < L * kBV; idx += kThreads) {
    const int r = idx / kBV, j = idx % kBV;
    float acc = 0.0f;
    if (bp.d_o.p)
      for (int t = r; t < L; ++t) acc += Aqk[t * kChunk + r] * s.dO[t * kBV + j];
    const float* kr = bp.kn + (int64_t(ck.t0 + r) * p.H + h) * p.K;
    for (int i = 0; i < p.K; ++i)
      acc += kr[i] * exp2f(gate_at(p, s.gs, L - 1, i) - gate_at(p, s.gs, r, i)) * s.dh[i * kBV + j];
    s.dvn[idx] = acc;
    if (bp.dvnew) bp.dvnew[(int64_t(ck.t0 + r) * p.HV + hv) * bp.Vw + v0 + j] = acc;
  }
}

template <int KD>
__global__ void __launch_bounds__(kThreads) bwd_dhu_kernel(const BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int n = blockIdx.x, hv = blockIdx.y, v0 = blockIdx.z * kBV, h = hv / p.G;
  extern __shared__ float smem[];
  DhuSmem s;
  s.dh = smem, s.dO = s.dh + KD * kBV, s.dvn = s.dO + kChunk * kBV, s.gs = s.dvn + kChunk * kBV;
  constexpr int kPer = KD * kBV / kThreads;
  for (int idx = threadIdx.x; idx < KD * kBV; idx += kThreads) {
    const int i = idx / kBV, j = idx % kBV;
    float x = 0.0f;
    if (bp.init == kInitIdentity) x = i == v0 + j ? 1.0f : 0.0f;
    else if (bp.dht.p) x = load_any(bp.dht.p, bp.dht.dt, n * bp.dht.sn + hv * bp.dht.shv + i * bp.dht.si + (v0 + j) * bp.dht.sj);
    s.dh[idx] = x;
  }
  for (int c = p.seq_chunk0[n + 1] - 1; c >= p.seq_chunk0[n]; --c) {
    const ChunkInfo ck = p.chunks[c];
    const int L = ck.len;
    __syncthreads();
    if (bp.dh)
      for (int idx = threadIdx.x; idx < KD * kBV; idx += kThreads)
        bp.dh[((int64_t(c) * p.HV + hv) * KD + idx / kBV) * bp.Vw + v0 + idx % kBV] = s.dh[idx];
    load_chunk(bp, ck, hv, v0, s);
    __syncthreads();
    form_dvnew(bp, ck, c, hv, v0, s);
    __syncthreads();
    float acc[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int idx = threadIdx.x + e * kThreads, i = idx / kBV, j = idx % kBV;
      float x = exp2f(gate_at(p, s.gs, L - 1, i)) * s.dh[idx];
      for (int r = 0; r < L; ++r) {
        const int64_t tr = int64_t(ck.t0 + r);
        const float w = p.w[(tr * p.HV + hv) * KD + i];
        x -= w * s.dvn[r * kBV + j];
        if (bp.d_o.p) x += p.scale * bp.qn[(tr * p.H + h) * KD + i] * exp2f(gate_at(p, s.gs, r, i)) * s.dO[r * kBV + j];
      }
      acc[e] = x;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < kPer; ++e) s.dh[threadIdx.x + e * kThreads] = acc[e];
  }
  __syncthreads();
  if (bp.dh0.p)
    for (int idx = threadIdx.x; idx < KD * kBV; idx += kThreads) {
      const int i = idx / kBV, j = idx % kBV;
      store_any(bp.dh0.p, bp.dh0.dt, n * bp.dh0.sn + hv * bp.dh0.shv + i * bp.dh0.si + (v0 + j) * bp.dh0.sj, s.dh[idx]);
    }
}

}  // namespace

void launch_bwd_dhu(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.N == 0) return;
  KCP_CHECK(bp.Vw % kBV == 0, "cuda-chunkwise backward: state columns ", bp.Vw, " must be a multiple of ", kBV);
  dispatch_key_dim(p.K, [&](auto kd) {
    constexpr int KD = decltype(kd)::value;
    const size_t smem = sizeof(float) * (KD * kBV + 2 * kChunk * kBV + kChunk * (p.kda ? KD : 1));
    launch_kernel(bwd_dhu_kernel<KD>, dim3(p.N, p.HV, bp.Vw / kBV), dim3(kThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
