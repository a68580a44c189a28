// Stage "WY", one block of 4 warps per (chunk, value head); warp i owns rows 16i..16i+15:
//   w = P @ (beta * k * Gamma)    [L,K]   Gamma_s = 2^(b_s) (gdn: scalar per row, kda: per channel)
//   u = P @ (beta * v)            [L,V]
//   kda only:  kg_r = k_r * 2^(b_end - b_r),  qg_r = q_r * 2^(b_r)   [L,K]   (b_end = b of row L-1)
// k and q are L2-normalized here when the flag fuses it. Unlike FLA, w, u, kg, qg stay float32
// (FLA stores them in the input dtype). Products: P (A operand, 64x64) times 32-column tiles of the
// right-hand sides on tensor cores (3xTF32 for float32 inputs).
// Covered by tests/cuda/test_cuda_stages.cpp ("wy").
#include "cuda/chunk_wy.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kLdP = 68, kTile = 32, kLdX = kTile + 8;

template <int KD, bool kKDA>
struct WySmem {
  static constexpr int ldg = kKDA ? KD : 1;
  static constexpr int floats = kChunk * kLdP + kChunk * kLdX + kChunk * ldg + 3 * kChunk;
  float *Ps, *Xs, *gs, *bet, *rk, *rq;
  __device__ explicit WySmem(float* base) {
    Ps = base, Xs = Ps + kChunk * kLdP, gs = Xs + kChunk * kLdX, bet = gs + kChunk * ldg;
    rk = bet + kChunk, rq = rk + kChunk;
  }
};

template <int KD, bool kKDA>
__device__ void load_common(const ChunkParams& p, const ChunkInfo& ck, int ci, int hv, const WySmem<KD, kKDA>& s) {
  const int h = hv / p.G, L = ck.len;
  const float4* P4 = reinterpret_cast<const float4*>(p.P + (int64_t(ci) * p.HV + hv) * kChunk * kChunk);
  for (int idx = threadIdx.x; idx < kChunk * kChunk / 4; idx += kThreads)
    *reinterpret_cast<float4*>(s.Ps + (idx / 16) * kLdP + 4 * (idx % 16)) = P4[idx];
  for (int idx = threadIdx.x; idx < kChunk * s.ldg; idx += kThreads) {
    const int r = idx / s.ldg, d = idx % s.ldg;
    s.gs[idx] = p.gcum[(int64_t(ck.t0 + min(r, L - 1)) * p.HV + hv) * s.ldg + d];
  }
  for (int r = threadIdx.x; r < kChunk; r += kThreads) {
    const int64_t tt = ck.t0 + r;
    s.bet[r] = r < L ? p.beta_e[tt * p.HV + hv] : 0.0f;
    s.rk[r] = (p.l2norm && r < L) ? p.rstd_k[tt * p.H + h] : 1.0f;
    s.rq[r] = (p.l2norm && r < L) ? p.rstd_q[tt * p.H + h] : 1.0f;
  }
}

// Right-hand side columns [c0, c0+32) of w (is_w) or u into Xs, zero past the chunk end.
template <class Tin, int KD, bool kKDA>
__device__ void fill_rhs(const ChunkParams& p, const ChunkInfo& ck, int hv, bool is_w, int c0, const WySmem<KD, kKDA>& s) {
  const Tin* src = static_cast<const Tin*>(is_w ? p.k.p : p.v.p);
  const RowsView& view = is_w ? p.k : p.v;
  const int x = is_w ? hv / p.G : hv;
  for (int idx = threadIdx.x; idx < kChunk * kTile; idx += kThreads) {
    const int r = idx / kTile, j = idx % kTile;
    float val = 0.0f;
    if (r < ck.len) {
      val = s.bet[r] * to_float(src[row_off(view, ck.t0 + r, x) + c0 + j]);
      if (is_w) val *= s.rk[r] * exp2f(kKDA ? s.gs[r * s.ldg + c0 + j] : s.gs[r]);
    }
    s.Xs[r * kLdX + j] = val;
  }
}

template <class Tin, int KD, bool kKDA>
__device__ void gated_kq(const ChunkParams& p, const ChunkInfo& ck, int hv, const WySmem<KD, kKDA>& s) {
  const Tin* kb = static_cast<const Tin*>(p.k.p);
  const Tin* qb = static_cast<const Tin*>(p.q.p);
  const int h = hv / p.G, L = ck.len;
  for (int idx = threadIdx.x; idx < L * KD; idx += kThreads) {
    const int r = idx / KD, d = idx % KD;
    const int64_t tt = ck.t0 + r, out = (tt * p.HV + hv) * KD + d;
    const float b = s.gs[r * KD + d], b_end = s.gs[(L - 1) * KD + d];
    p.kg[out] = to_float(kb[row_off(p.k, tt, h) + d]) * s.rk[r] * exp2f(b_end - b);
    p.qg[out] = to_float(qb[row_off(p.q, tt, h) + d]) * s.rq[r] * exp2f(b);
  }
}

template <class Tin, int KD, bool kKDA>
__global__ void __launch_bounds__(kThreads) chunk_wy_kernel(const ChunkParams p) {
  constexpr bool S = kSplitProducts<Tin>;
  extern __shared__ float4 smem_f4[];
  const WySmem<KD, kKDA> s(reinterpret_cast<float*>(smem_f4));
  const int ci = blockIdx.x, hv = blockIdx.y, m0 = 16 * (threadIdx.x >> 5);
  const ChunkInfo ck = p.chunks[ci];
  load_common<KD, kKDA>(p, ck, ci, hv, s);
  __syncthreads();
  FragA<S> fa[kChunk / 8];
#pragma unroll
  for (int ks = 0; ks < kChunk / 8; ++ks) fa[ks] = load_a_row<S>(s.Ps, kLdP, m0, 8 * ks);
  for (int col = 0; col < KD + p.V; col += kTile) {
    const bool is_w = col < KD;
    const int c0 = is_w ? col : col - KD, D = is_w ? KD : p.V;
    fill_rhs<Tin, KD, kKDA>(p, ck, hv, is_w, c0, s);
    __syncthreads();
    float acc[kTile / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kChunk / 8; ++ks)
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt) mma(acc[nt], fa[ks], load_b_kn<S>(s.Xs, kLdX, 8 * ks, 8 * nt));
    float* out = is_w ? p.w : p.u;
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = acc_row(m0, e), c = acc_col(8 * nt, e);
        if (r < ck.len)
          *reinterpret_cast<float2*>(out + (int64_t(ck.t0 + r) * p.HV + hv) * D + c0 + c) =
              make_float2(acc[nt][e], acc[nt][e + 1]);
      }
    __syncthreads();
  }
  if constexpr (kKDA) gated_kq<Tin, KD, kKDA>(p, ck, hv, s);
}

template <class Tin, int KD, bool kKDA>
void launch(const ChunkParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(float) * WySmem<KD, kKDA>::floats;
  auto kernel = chunk_wy_kernel<Tin, KD, kKDA>;
  KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(p.NT, p.HV), kThreads, smem, stream>>>(p);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_chunk_wy(const ChunkParams& p, int input_dtype, cudaStream_t stream) {
  if (p.NT == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      if (p.kda) launch<Tin, KD, true>(p, stream);
      else launch<Tin, KD, false>(p, stream);
    });
  });
}

}  // namespace kcp::cuda
