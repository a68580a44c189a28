// Stage "kkt + solve_tril", one block of 4 warps per (chunk, value head); warp i owns rows 16i..16i+15.
//   gdn:  Lmat[r,s] = beta_r (k_r . k_s) 2^(b_r - b_s)   (s < r),  Aqk[r,s] = scale (q_r . k_s) 2^(b_r - b_s)   (s <= r)
//   kda:  the same with per-channel decay inside the dot: sum_d k_r[d] k_s[d] 2^(b_r[d] - b_s[d]).
//         Products run on tensor cores through the anchor n = 16i (first row of the warp's block):
//         (k_r 2^(b_r - b_n)) . (k_s 2^(b_n - b_s)); both exponents are <= 0 for s < n. On the
//         diagonal block the second exponent is >= 0 and bounded by the block's gate range R; when
//         R > 64 (log2 units) that block is summed pairwise with exact per-pair exponents instead.
//   P = (I + Lmat)^-1: 16x16 diagonal blocks by forward substitution, then block rows
//         P_ij = -P_ii sum_{m=j}^{i-1} Lmat_im P_mj, all in float32.
// Outputs (float32): Aqk, P [NT,HV,64,64], rows/cols >= L zero (P: identity there).
// Covered by tests/cuda/test_cuda_stages.cpp ("kkt").
#include "cuda/chunk_kkt.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kLdL = 68;           // 64x64 float tiles (row-major A pattern)
constexpr float kMaxAnchorRange = 64.0f;  // log2 units: anchored factors stay within 2^-64 .. 2^64

template <int KD, bool kKDA>
struct KktSmem {
  static constexpr int ldk = KD + 4, ldg = kKDA ? KD + 4 : 1;
  static constexpr int floats = 2 * kChunk * ldk + kChunk * ldg + kChunk + 3 * kChunk * kLdL + 16 * kLdL;
  float *ks, *qs, *gs, *bet, *Ls, *As, *Ps, *Xs;
  __device__ explicit KktSmem(float* base) {
    ks = base, qs = ks + kChunk * ldk, gs = qs + kChunk * ldk, bet = gs + kChunk * ldg;
    Ls = bet + kChunk, As = Ls + kChunk * kLdL, Ps = As + kChunk * kLdL, Xs = Ps + kChunk * kLdL;
  }
};

// k, q rows (L2-normalized when fused) as float32, zero past the chunk end; gates padded with row L-1.
template <class Tin, int KD, bool kKDA>
__device__ void load_tiles(const ChunkParams& p, const ChunkInfo& ck, int hv, const KktSmem<KD, kKDA>& s) {
  using Sm = KktSmem<KD, kKDA>;
  const int h = hv / p.G, L = ck.len;
  const Tin* kb = static_cast<const Tin*>(p.k.p);
  const Tin* qb = static_cast<const Tin*>(p.q.p);
  for (int idx = threadIdx.x; idx < kChunk * KD; idx += kThreads) {
    const int r = idx / KD, d = idx % KD, tt = ck.t0 + r;
    float kv = 0.0f, qv = 0.0f;
    if (r < L) {
      kv = to_float(kb[row_off(p.k, tt, h) + d]);
      qv = to_float(qb[row_off(p.q, tt, h) + d]);
      if (p.l2norm) kv *= p.rstd_k[int64_t(tt) * p.H + h], qv *= p.rstd_q[int64_t(tt) * p.H + h];
    }
    s.ks[r * Sm::ldk + d] = kv;
    s.qs[r * Sm::ldk + d] = qv;
    if constexpr (kKDA) s.gs[r * Sm::ldg + d] = p.gcum[(int64_t(ck.t0 + min(r, L - 1)) * p.HV + hv) * KD + d];
  }
  for (int r = threadIdx.x; r < kChunk; r += kThreads) {
    if constexpr (!kKDA) s.gs[r] = p.gcum[int64_t(ck.t0 + min(r, L - 1)) * p.HV + hv];
    s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
  }
  for (int idx = threadIdx.x; idx < 3 * kChunk * kLdL; idx += kThreads) s.Ls[idx] = 0.0f;  // Ls, As, Ps
}

// kda: largest per-channel gate drop over the valid rows of the block starting at n (warp-wide).
template <int KD>
__device__ float block_gate_range(const float* gs, int ldg, int n, int last) {
  float R = 0.0f;
  for (int d = threadIdx.x & 31; d < KD; d += 32) R = fmaxf(R, gs[n * ldg + d] - gs[last * ldg + d]);
  for (int o = 16; o > 0; o >>= 1) R = fmaxf(R, __shfl_xor_sync(0xffffffffu, R, o));
  return R;
}

// This warp's row block of k k^T and q k^T (gated), written into Ls / As with beta, scale and masks.
template <int KD, bool kKDA, bool S>
__device__ void row_block_products(const ChunkParams& p, int L, const KktSmem<KD, kKDA>& s, int i, bool diag_mma) {
  using Sm = KktSmem<KD, kKDA>;
  const int n = 16 * i, ntiles = 2 * i + 2, g = lane_g(), t = lane_t();
  float ak[8][4] = {}, aq[8][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < KD; k0 += 8) {
    FragA<S> fk, fq;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = n + g + 8 * (e & 1), d = k0 + t + 4 * (e >> 1);
      float f = 1.0f;
      if constexpr (kKDA) f = exp2f(s.gs[r * Sm::ldg + d] - s.gs[n * Sm::ldg + d]);
      fk.set(e, s.ks[r * Sm::ldk + d] * f);
      fq.set(e, s.qs[r * Sm::ldk + d] * f);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt >= ntiles || (kKDA && !diag_mma && nt >= 2 * i)) continue;
      const FragB<S> fb = load_b<S>(
          [&](int d, int sc) {
            float f = 1.0f;
            if constexpr (kKDA) f = exp2f(s.gs[n * Sm::ldg + d] - s.gs[sc * Sm::ldg + d]);
            return s.ks[sc * Sm::ldk + d] * f;
          },
          k0, 8 * nt);
      mma(ak[nt], fk, fb);
      mma(aq[nt], fq, fb);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt >= ntiles) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(n, e), c = acc_col(8 * nt, e);
      if (r >= L || c > r) continue;
      float f = 1.0f;
      if constexpr (!kKDA) f = exp2f(s.gs[r] - s.gs[c]);
      if (c < r) s.Ls[r * kLdL + c] = s.bet[r] * ak[nt][e] * f;
      s.As[r * kLdL + c] = p.scale * aq[nt][e] * f;
    }
  }
}

// kda diagonal block with exact per-pair exponents (used when the anchored factors could overflow).
template <int KD>
__device__ void diagonal_block_pairwise(const ChunkParams& p, int L, const KktSmem<KD, true>& s, int i) {
  using Sm = KktSmem<KD, true>;
  const int n = 16 * i;
  for (int pi = threadIdx.x & 31; pi < 136; pi += 32) {  // 136 = pairs s <= r in a 16-row block
    int rl = 0;
    while ((rl + 1) * (rl + 2) / 2 <= pi) ++rl;
    const int r = n + rl, c = n + pi - rl * (rl + 1) / 2;
    if (r >= L) continue;
    float sk = 0.0f, sq = 0.0f;
    for (int d = 0; d < KD; ++d) {
      const float kc = s.ks[c * Sm::ldk + d] * exp2f(s.gs[r * Sm::ldg + d] - s.gs[c * Sm::ldg + d]);
      sk += s.ks[r * Sm::ldk + d] * kc;
      sq += s.qs[r * Sm::ldk + d] * kc;
    }
    if (c < r) s.Ls[r * kLdL + c] = s.bet[r] * sk;
    s.As[r * kLdL + c] = p.scale * sq;
  }
}

// P = (I + Ls)^-1 into Ps (zero-initialized), float32.
__device__ void solve_unit_lower(const float* Ls, float* Ps, float* Xs) {
  const int tid = threadIdx.x;
  if (tid < kChunk) {  // diagonal 16x16 blocks, one column per thread
    const int base = 16 * (tid >> 4), c = tid & 15, col = base + c;
    Ps[(base + c) * kLdL + col] = 1.0f;
    for (int r = c + 1; r < 16; ++r) {
      float acc = 0.0f;
      for (int j = c; j < r; ++j) acc += Ls[(base + r) * kLdL + base + j] * Ps[(base + j) * kLdL + col];
      Ps[(base + r) * kLdL + col] = -acc;
    }
  }
  __syncthreads();
  for (int i = 1; i < 4; ++i) {
    const int w = 16 * i;  // block row i covers rows w..w+15; its off-diagonal columns are 0..w-1
    for (int idx = tid; idx < 16 * w; idx += kThreads) {
      const int r = idx / w, c = idx % w;
      float acc = 0.0f;
      for (int m = c; m < w; ++m) acc += Ls[(w + r) * kLdL + m] * Ps[m * kLdL + c];
      Xs[r * kLdL + c] = acc;
    }
    __syncthreads();
    for (int idx = tid; idx < 16 * w; idx += kThreads) {
      const int r = idx / w, c = idx % w;
      float acc = 0.0f;
      for (int m = 0; m <= r; ++m) acc += Ps[(w + r) * kLdL + w + m] * Xs[m * kLdL + c];
      Ps[(w + r) * kLdL + c] = -acc;
    }
    __syncthreads();
  }
}

__device__ void store_tile64(const float* src, float* dst) {
  for (int idx = threadIdx.x; idx < kChunk * kChunk / 4; idx += kThreads) {
    const int r = idx / 16, c4 = idx % 16;
    reinterpret_cast<float4*>(dst)[idx] = *reinterpret_cast<const float4*>(src + r * kLdL + 4 * c4);
  }
}

template <class Tin, int KD, bool kKDA, bool S>
__global__ void __launch_bounds__(kThreads) chunk_kkt_kernel(const ChunkParams p) {
  extern __shared__ float4 smem_f4[];
  const KktSmem<KD, kKDA> s(reinterpret_cast<float*>(smem_f4));
  const int ci = blockIdx.x, hv = blockIdx.y, warp = threadIdx.x >> 5;
  const ChunkInfo ck = p.chunks[ci];
  load_tiles<Tin, KD, kKDA>(p, ck, hv, s);
  __syncthreads();
  const int n = 16 * warp;
  if (n < ck.len) {
    bool diag_mma = true;
    if constexpr (kKDA) diag_mma = block_gate_range<KD>(s.gs, s.ldg, n, min(n + 15, ck.len - 1)) <= kMaxAnchorRange;
    row_block_products<KD, kKDA, S>(p, ck.len, s, warp, diag_mma);
    if constexpr (kKDA) {
      __syncwarp();
      if (!diag_mma) diagonal_block_pairwise<KD>(p, ck.len, s, warp);
    }
  }
  __syncthreads();
  const int64_t tile = (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
  store_tile64(s.As, p.Aqk + tile);
  solve_unit_lower(s.Ls, s.Ps, s.Xs);
  store_tile64(s.Ps, p.P + tile);
}

template <class Tin, int KD, bool kKDA, bool S>
void launch(const ChunkParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(float) * KktSmem<KD, kKDA>::floats;
  auto kernel = chunk_kkt_kernel<Tin, KD, kKDA, S>;
  KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(p.NT, p.HV), kThreads, smem, stream>>>(p);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_chunk_kkt(const ChunkParams& p, int input_dtype, cudaStream_t stream) {
  if (p.NT == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      if (p.kda) launch<Tin, KD, true, kSplitProducts<Tin>>(p, stream);
      else launch<Tin, KD, false, kSplitProducts<Tin>>(p, stream);
    });
  });
}

}  // namespace kcp::cuda
