// Backward stage "dhu", part 1 of 2: the chunk-local terms of the state-gradient recurrence, in
// parallel over the chunks (CPU twins chunk_bwd_dAv's dv_loc and chunk_state_backward's qg^T do).
// Grid (chunks, HV), 256 threads; per chunk, b the gate cumsum (log2 units), L rows:
//   kg  = kn Diag-per-row 2^(b_end - b_r)        [L,K]  -> bp.dkv  (free until the chunk stage)
//   A_c = Aqk^T do                               [L,V]  -> bp.dvnew (dhu adds kg dh: dvnew)
//   B_c = scale qg^T do,  qg_r = qn_r 2^(b_r)    [K,V]  -> bp.dh[c] (dhu reads it, then stores dh[c])
// A_c and B_c only with do (not for the transition's M^T). Register tiles of 4x4 (B_c: 8x4) over
// 64-column slabs of V, float32 FMA.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

template <int KD>
struct LocalSmem {
  static constexpr int ldq = KD + 4, kV = 64;
  static constexpr int floats = kChunk * ldq + 2 * kChunk * kLdC + 64;
  float *qg, *A, *dO, *gsc;
  __device__ explicit LocalSmem(float* s) : qg(s), A(s + kChunk * ldq), dO(A + kChunk * kLdC), gsc(dO + kChunk * kLdC) {}
};

// kg to the workspace and scale qg into shared memory (rows >= L zero), 32 keys at a time: qn, kn
// (and kda's gates) staged by cp.async in the A / dO tiles (free until the products).
template <int KD, bool kKDA>
__device__ void local_gated_rows(const BwdParams& bp, const LocalSmem<KD>& s, const ChunkInfo& ck, int hv) {
  const ChunkParams& p = bp.c;
  const int L = ck.len, h = hv / p.G;
  float *qs = s.A, *ks = qs + kChunk * kLdS, *gs = kKDA ? ks + kChunk * kLdS : s.gsc;
  for (int d0 = 0; d0 < KD; d0 += kSlab) {
    __syncthreads();  // the previous slab is consumed
    copy_rows_async(qs, kLdS, bp.qn + (int64_t(ck.t0) * p.H + h) * KD, int64_t(p.H) * KD, L, d0, kSlab);
    copy_rows_async(ks, kLdS, bp.kn + (int64_t(ck.t0) * p.H + h) * KD, int64_t(p.H) * KD, L, d0, kSlab);
    if constexpr (kKDA) copy_gates_async<true>(gs, kLdS, p, ck, hv, d0, kSlab);
    cp_async_wait_all();
    __syncthreads();
    for (int idx = threadIdx.x; idx < kChunk * kSlab; idx += kBwdThreads) {
      const int r = idx / kSlab, c = idx % kSlab;
      const float g = gate_of<kKDA>(gs, kLdS, r, c), ge = gate_of<kKDA>(gs, kLdS, L - 1, c);
      if (r < L) bp.dkv[(int64_t(ck.t0 + r) * p.HV + hv) * KD + d0 + c] = ks[r * kLdS + c] * exp2f(ge - g);
      s.qg[r * LocalSmem<KD>::ldq + d0 + c] = p.scale * qs[r * kLdS + c] * exp2f(g);  // rows >= L: q = 0
    }
  }
}

// A_c and B_c for the 64 value columns [j0, j0 + 64) (do of those columns in s.dO).
template <int KD>
__device__ void local_products(const BwdParams& bp, const LocalSmem<KD>& s, const ChunkInfo& ck, int hv, int j0) {
  using S = LocalSmem<KD>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, ty = bwd_ty(), tx = bwd_tx(), c = 4 * tx;
  const int nc = min(S::kV, p.V - j0);
  {  // A_c rows 4 ty .. 4 ty + 3: sum_{t >= r} Aqk[t][r] do[t][:]
    float acc[4][4] = {};
    for (int t = 4 * ty; t < L; ++t) {
      const float4 a = lds4(s.A + t * kLdC + 4 * ty), b = lds4(s.dO + t * kLdC + c);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float au = t >= 4 * ty + u ? av[u] : 0.0f;  // Aqk is lower triangular (t >= r)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[u][v] = fmaf(au, bv[v], acc[u][v]);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int r = 4 * ty + u;
      if (r < L && c < nc)
        *reinterpret_cast<float4*>(bp.dvnew + (int64_t(ck.t0 + r) * p.HV + hv) * p.V + j0 + c) =
            make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
    }
  }
  constexpr int NU = KD >= 64 ? KD / 64 : 1;  // key row groups of 4 per thread: 4 ty + 64 u
  float acc[NU][4][4] = {};
  for (int r = 0; r < L; ++r) {
    const float4 b = lds4(s.dO + r * kLdC + c);
    const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int g = 0; g < NU; ++g) {
      if (4 * ty + 64 * g >= KD) continue;
      const float4 a = lds4(s.qg + r * S::ldq + 4 * ty + 64 * g);
      const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[g][u][v] = fmaf(av[u], bv[v], acc[g][u][v]);
    }
  }
  float* Bc = bp.dh + (int64_t(blockIdx.x) * p.HV + hv) * KD * p.V;
#pragma unroll
  for (int g = 0; g < NU; ++g)
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = 4 * ty + 64 * g + u;
      if (i < KD && c < nc)
        *reinterpret_cast<float4*>(Bc + int64_t(i) * p.V + j0 + c) = make_float4(acc[g][u][0], acc[g][u][1], acc[g][u][2], acc[g][u][3]);
    }
}

template <int KD, bool kKDA>
__global__ void __launch_bounds__(kBwdThreads) bwd_dhu_local_kernel(const __grid_constant__ BwdParams bp) {
  using S = LocalSmem<KD>;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[blockIdx.x];
  const int hv = blockIdx.y, L = ck.len;
  extern __shared__ __align__(16) float smem[];
  const S s(smem);
  if constexpr (!kKDA) copy_gates_async<false>(s.gsc, 0, p, ck, hv, 0, 1);  // waited for with the first slab
  local_gated_rows<KD, kKDA>(bp, s, ck, hv);
  if (!bp.d_o.p) return;
  __syncthreads();  // the staged slabs are consumed
  copy_rows_async(s.A, kLdC, p.Aqk + (int64_t(blockIdx.x) * p.HV + hv) * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  for (int j0 = 0; j0 < p.V; j0 += S::kV) {
    __syncthreads();
    load_rows_any<S::kV>(s.dO, kLdC, bp.d_o, ck.t0, hv, L, j0, min(S::kV, p.V - j0));
    cp_async_wait_all();
    for (int idx = threadIdx.x; idx < kChunk * S::kV; idx += kBwdThreads)  // columns past V
      if (idx % S::kV >= p.V - j0) s.dO[(idx / S::kV) * kLdC + idx % S::kV] = 0.0f;
    __syncthreads();
    local_products<KD>(bp, s, ck, hv, j0);
  }
}

}  // namespace

void launch_bwd_dhu_local(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.NT == 0) return;
  dispatch_key_dim(p.K, [&](auto kd) {
    constexpr int KD = decltype(kd)::value;
    const size_t smem = sizeof(float) * LocalSmem<KD>::floats;
    if (p.kda) launch_kernel(bwd_dhu_local_kernel<KD, true>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_dhu_local_kernel<KD, false>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
