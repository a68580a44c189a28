// Stage "kkt + solve_tril", one block per (chunk, value head). gdn: 4 warps, warp i owns rows
// 16i..16i+15 and all their n-tiles. kda, gla: 8 warps sharing row block i's 2i + 2 n-tiles so that
// none has more than 3 (warp_tiles): with kda's 4 warps the one of row block 3 did 8 tiles against row
// block 0's 2, the others waited at the solve's barrier (14% of the stall samples, ncu at T = 32768),
// and 2 blocks of 4 warps per multiprocessor (shared memory) left 0.35 eligible warps per scheduler.
//   gdn:  Lmat[r,s] = beta_r (k_r . k_s) 2^(b_r - b_s)   (s < r),  Aqk[r,s] = scale (q_r . k_s) 2^(b_r - b_s)   (s <= r)
//   kda:  the same with per-channel decay inside the dot: sum_d k_r[d] k_s[d] 2^(b_r[d] - b_s[d]).
//         Products run on tensor cores through the anchor n = 16i (first row of the warp's block):
//         (k_r 2^(b_r - b_n)) . (k_s 2^(b_n - b_s)); both exponents are <= 0 for s < n. On the
//         diagonal block the second exponent is >= 0 and bounded by the block's gate range R; when
//         R > 64 (log2 units) that block is summed pairwise with exact per-pair exponents instead.
//   With the fused L2 norm, k_r . k_s is scaled by rstd_r rstd_s afterwards (q likewise).
//   gdn with 16-bit inputs: the raw dots as m16n8k16 16-bit products with ldmatrix fragments (exact
//   products, float32 sums: the same values as TF32 on exact inputs); otherwise TF32 fragments.
//   P = (I + Lmat)^-1: 16x16 diagonal blocks by forward substitution (float32), then block rows
//         P_ij = -P_ii sum_{m=j}^{i-1} Lmat_im P_mj on tensor cores (TF32, or 3xTF32 when split).
//   gla (kDelta = false, ChunkParams::gla): Aqk only. beta_e = 0 makes Lmat = 0 and P = I, so the
//         k k^T products, the solve and P are skipped (P is not written; nothing reads it for gla).
//         Instead the block writes the gated rows kg_r = k_r 2^(b_end - b_r), qg_r = q_r 2^(b_r)
//         (with the L2 norm's rstd) from the tiles it has loaded: gla runs no WY stage. Where the
//         chunk's gate spread allows, gla anchors every pair at the chunk's last row instead of each
//         16-row block's first, Aqk = scale (q 2^(b - b_end)) kg^T (chunk_kkt_gla.cuh).
// Raw k, q rows arrive by cp.async (zero past the chunk end). kda, gla: the stage forms the chunk's
// gate cumsum tile from the raw gates (scan_gate_tile, rows >= L repeating row L-1) and beta_e, and
// writes both to the workspace for the later stages (chunk_cumsum.cu does not form them). gla's
// forward without keep (ChunkParams::forward_only): gcum only each chunk's last row.
// Outputs (float32, TF32-rounded when products are not split): Aqk, P (not gla) [NT,HV,64,64]; rows and
// columns >= L are zero (P: identity there). gla: kg, qg [TT,HV,K] (rows < L), as the WY stage's.
// gdn with 16-bit inputs and ChunkParams::kkt_writes_w (the kept forward, the backward's recompute):
// also w = P (beta rk 2^b k) [TT,HV,K] (rows < L), the WY stage's w bit for bit (write_w), so that
// stage does not run: its launch and its reads of P and k go (H200, T = 8192, H = 16: kkt 62 -> 88 us,
// WY's 51 us gone).
// Covered by tests/cuda/test_cuda_stages.cpp ("kkt", and "kkt w" against the WY stage bit for bit).
#include "cuda/chunk_kkt.cuh"
#include "cuda/chunk_gates.cuh"
#include "cuda/chunk_kkt_gla.cuh"
#include "cuda/chunk_kkt_tiles.cuh"
#include "cuda/chunk_rows.cuh"

#include <algorithm>

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

using namespace kkt;

template <bool kDelta, class Tin, int KD, bool kKDA>
__device__ void load_tiles(const ChunkParams& p, const ChunkInfo& ck, int hv, const KktSmem<Tin, KD, kKDA>& s) {
  using Sm = KktSmem<Tin, KD, kKDA>;
  const int h = hv / p.G, L = ck.len;
  constexpr int segs = KD * int(sizeof(Tin)) / 16, per = 16 / int(sizeof(Tin));
  for (int idx = threadIdx.x; idx < kChunk * segs; idx += kkt_threads<kKDA>) {
    const int r = idx / segs, sg = idx % segs, rr = r < L ? r : 0;
    cp_async16(s.ks + r * Sm::ldk + sg * per, static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0 + rr, h) + sg * per, r < L);
    cp_async16(s.qs + r * Sm::ldk + sg * per, static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0 + rr, h) + sg * per, r < L);
  }
  load_chunk_row_scalars<kKDA, !kKDA>(p, ck, hv, h, s.gs, s.bet, s.rk, s.rq);
  cp_async_commit();
  if constexpr (kDelta)
    for (int idx = threadIdx.x; idx < kChunk * kLdL / 4; idx += kkt_threads<kKDA>)
      reinterpret_cast<float4*>(s.Ls)[idx] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if constexpr (kKDA) {  // kda, gla: this stage forms beta_e and the gate tile (chunk_gates.cuh), the k, q copies in flight
    for (int r = threadIdx.x; r < kChunk; r += kkt_threads<kKDA>) {
      const float b = r < L ? effective_beta(p, ck.t0 + r, hv) : 0.0f;
      s.bet[r] = b;
      if (r < L) p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] = b;
    }
    scan_gate_tile<KD, kkt_threads<kKDA>>(p, ck, hv, s.gs, Sm::ldg);  // its stores: the kernel's last step
  }
  cp_async_wait<0>();
}

// kda: largest per-channel gate drop over the valid rows of the block starting at n (warp-wide).
template <int KD>
__device__ float block_gate_range(const float* gs, int ldg, int n, int last) {
  float R = 0.0f;
  for (int d = threadIdx.x & 31; d < KD; d += 32) R = fmaxf(R, gs[n * ldg + d] - gs[last * ldg + d]);
  for (int o = 16; o > 0; o >>= 1) R = fmaxf(R, __shfl_xor_sync(0xffffffffu, R, o));
  return R;
}

// Writes Lmat (shared) and Aqk (global) entries (r, c), c <= r, from the raw dots.
template <bool S, bool kDelta, class Tin, int KD, bool kKDA>
__device__ void put_entry(const ChunkParams& p, const KktSmem<Tin, KD, kKDA>& s, float* aqk, int r, int c,
                          float dk, float dq) {
  float f = s.rk[c];
  if constexpr (!kKDA) f *= exp2f(s.gs[r] - s.gs[c]);
  if (kDelta && c < r) {
    const float g = s.rk[r] * dk * f;  // G_rc; kda keeps it for the backward's WY kernel (ChunkParams::Gk)
    s.Ls[r * kLdL + c] = s.bet[r] * g;
    if (kKDA && p.Gk) p.Gk[(aqk - p.Aqk) + r * kChunk + c] = g;
  }
  aqk[r * kChunk + c] = operand_store<S>(p.scale * s.rq[r] * dq * f);
}

// gdn with 16-bit inputs: raw k k^T and q k^T of row block i by m16n8k16 16-bit products, fragments
// by ldmatrix (the same values as the TF32 path: the inputs are exact in both).
template <class Tin, int KD>
__device__ void row_block_dots16(const KktSmem<Tin, KD, false>& s, int i, float (&ak)[8][4], float (&aq)[8][4]) {
  constexpr int ld = KktSmem<Tin, KD, false>::ldk;
  const int l = threadIdx.x & 31, n = 16 * i;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t fk[4], fq[4];
    ldsm_x4(fk, s.ks + (n + (l & 15)) * ld + k0 + (l >> 4) * 8);
    ldsm_x4(fq, s.qs + (n + (l & 15)) * ld + k0 + (l >> 4) * 8);
#pragma unroll
    for (int np = 0; np < 4; ++np) {  // n-tiles 2np, 2np+1 (rows 16np.. of k); 2i+2 tiles in all
      if (np > i) continue;
      uint32_t b[4];
      ldsm_x4(b, s.ks + (16 * np + (l & 7) + ((l >> 4) << 3)) * ld + k0 + ((l >> 3) & 1) * 8);
      mma_16bit<Tin>(ak[2 * np], fk, b[0], b[1]), mma_16bit<Tin>(aq[2 * np], fq, b[0], b[1]);
      mma_16bit<Tin>(ak[2 * np + 1], fk, b[2], b[3]), mma_16bit<Tin>(aq[2 * np + 1], fq, b[2], b[3]);
    }
  }
}

// Whether a warp computes n-tile nt of its row block by tensor-core products (kda: not the diagonal
// block's two when its gate range needs the pairwise form).
template <bool kKDA>
__device__ __forceinline__ bool tile_by_mma(const WarpTiles& wt, int nt, bool diag_mma) {
  return nt < wt.hi && !(kKDA && !diag_mma && nt >= 2 * wt.i);
}

// The warp's n-tiles wt.lo + j of row block i of k k^T (not for gla) and q k^T by TF32 products with
// fragments built element by element (kda: each factor carries its decay through the block's anchor
// row n = 16 i; float32 inputs: split products).
template <bool S, bool kDelta, int MT, class Tin, int KD, bool kKDA>
__device__ void row_block_dots_tf32(const KktSmem<Tin, KD, kKDA>& s, const WarpTiles& wt, bool diag_mma, float (&ak)[MT][4],
                                    float (&aq)[MT][4]) {
  using Sm = KktSmem<Tin, KD, kKDA>;
  const int n = 16 * wt.i, g = lane_g(), t = lane_t();
#pragma unroll 2
  for (int k0 = 0; k0 < KD; k0 += 8) {
    FragA<S> fk, fq;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = n + g + 8 * (e & 1), d = k0 + t + 4 * (e >> 1);
      float f = 1.0f;
      if constexpr (kKDA) f = exp2_approx<S>(s.gs[r * Sm::ldg + d] - s.gs[n * Sm::ldg + d]);  // TF32-rounded by mma
      if constexpr (kDelta) fk.set(e, to_float(s.ks[r * Sm::ldk + d]) * f);
      fq.set(e, to_float(s.qs[r * Sm::ldk + d]) * f);
    }
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int nt = wt.lo + j;
      if (!tile_by_mma<kKDA>(wt, nt, diag_mma)) continue;
      const FragB<S> fb = load_b<S>(
          [&](int d, int sc) {
            float f = 1.0f;
            if constexpr (kKDA) f = exp2_approx<S>(s.gs[n * Sm::ldg + d] - s.gs[sc * Sm::ldg + d]);
            return to_float(s.ks[sc * Sm::ldk + d]) * f;
          },
          k0, 8 * nt);
      if constexpr (kDelta) mma(ak[j], fk, fb);
      mma(aq[j], fq, fb);
    }
  }
}

// This warp's n-tiles of its row block of k k^T and q k^T (gated); entries above the diagonal and of
// rows >= L stay 0.
template <bool S, bool kDelta, class Tin, int KD, bool kKDA>
__device__ void row_block_products(const ChunkParams& p, int L, const KktSmem<Tin, KD, kKDA>& s, float* aqk,
                                   const WarpTiles& wt, bool diag_mma) {
  constexpr int MT = kMaxTiles<kkt_threads<kKDA>>;
  const int n = 16 * wt.i;
  float ak[MT][4] = {}, aq[MT][4] = {};
  if constexpr (!kKDA && sizeof(Tin) == 2) row_block_dots16(s, wt.i, ak, aq);  // gdn: one warp, every n-tile (lo = 0)
  else row_block_dots_tf32<S, kDelta>(s, wt, diag_mma, ak, aq);
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const int nt = wt.lo + j;
    if (!tile_by_mma<kKDA>(wt, nt, diag_mma)) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(n, e), c = acc_col(8 * nt, e);
      if (r < L && c <= r) put_entry<S, kDelta>(p, s, aqk, r, c, ak[j][e], aq[j][e]);
    }
  }
}

// kda diagonal block with exact per-pair exponents (used when the anchored factors could overflow).
template <bool S, bool kDelta, class Tin, int KD>
__device__ void diagonal_block_pairwise(const ChunkParams& p, int L, const KktSmem<Tin, KD, true>& s, float* aqk, int i) {
  using Sm = KktSmem<Tin, KD, true>;
  const int n = 16 * i;
  for (int pi = threadIdx.x & 31; pi < 136; pi += 32) {  // 136 = pairs c <= r in a 16-row block
    int rl = 0;
    while ((rl + 1) * (rl + 2) / 2 <= pi) ++rl;
    const int r = n + rl, c = n + pi - rl * (rl + 1) / 2;
    if (r >= L) continue;
    float sk = 0.0f, sq = 0.0f;
    for (int d = 0; d < KD; ++d) {
      const float kc = to_float(s.ks[c * Sm::ldk + d]) * exp2f(s.gs[r * Sm::ldg + d] - s.gs[c * Sm::ldg + d]);
      if constexpr (kDelta) sk += to_float(s.ks[r * Sm::ldk + d]) * kc;
      sq += to_float(s.qs[r * Sm::ldk + d]) * kc;
    }
    put_entry<S, kDelta>(p, s, aqk, r, c, sk, sq);
  }
}

// gla: kg = k E, qg = q Gamma of the chunk's rows < L (gated_kq, as the WY stage's kda slabs), from
// the loaded tiles (gates of rows >= L repeat row L-1); four keys per thread and step, stored as
// 16-byte vectors (the element loop was 44% of this kernel's instructions).
template <bool S, class Tin, int KD>
__device__ void write_gated_rows(const ChunkParams& p, const ChunkInfo& ck, int hv, const KktSmem<Tin, KD, true>& s) {
  using Sm = KktSmem<Tin, KD, true>;
  const int L = ck.len;
  const float* be = s.gs + (L - 1) * Sm::ldg;
  for (int idx = threadIdx.x; idx < L * KD / 4; idx += kkt_threads<true>) {
    const int r = idx / (KD / 4), d = 4 * (idx % (KD / 4));
    float kg[4], qg[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 x = gated_kq<S>(to_float(s.ks[r * Sm::ldk + d + j]), to_float(s.qs[r * Sm::ldk + d + j]), s.rk[r],
                                   s.rq[r], s.gs[r * Sm::ldg + d + j], be[d + j]);
      kg[j] = x.x, qg[j] = x.y;
    }
    const int64_t out = (int64_t(ck.t0 + r) * p.HV + hv) * KD + d;
    *reinterpret_cast<float4*>(p.kg + out) = make_float4(kg[0], kg[1], kg[2], kg[3]);
    *reinterpret_cast<float4*>(p.qg + out) = make_float4(qg[0], qg[1], qg[2], qg[3]);
  }
}

// gla: 3 blocks of 8 warps per multiprocessor (what its shared memory allows) need <= 85 registers;
// without the bound the gate tile's scan took it to 94 (2 blocks). kda: 2 blocks (its shared memory).
template <class Tin, int KD, bool kKDA, bool kDelta>
__global__ void __launch_bounds__(kkt_threads<kKDA>, kKDA ? (kDelta ? 2 : 3) : 0) chunk_kkt_kernel(const ChunkParams p) {
  constexpr bool S = kSplitProducts<Tin>;
  constexpr int kThreads = kkt_threads<kKDA>;
  extern __shared__ float4 smem_f4[];
  const KktSmem<Tin, KD, kKDA> s(reinterpret_cast<char*>(smem_f4));
  const int ci = int(blockIdx.x) + p.c_off, hv = blockIdx.y;
  const WarpTiles wt = warp_tiles<kThreads>(int(threadIdx.x >> 5));
  const ChunkInfo ck = chunk_at(p, ci);
  const int64_t tile = (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
  float* aqk = p.Aqk + tile;
  for (int idx = threadIdx.x; idx < kChunk * kChunk / 4; idx += kThreads)  // entries never computed are 0
    reinterpret_cast<float4*>(aqk)[idx] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  load_tiles<kDelta>(p, ck, hv, s);
  if constexpr (!kDelta) {  // gla: one anchor per chunk where its gates allow (chunk_kkt_gla.cuh)
    float be[4];
    if (gla_chunk_anchored<KD, kThreads>(s.gs, s.ldg, ck.len, be)) {  // a barrier
      using Sm = KktSmem<Tin, KD, kKDA>;
      gla_anchor_pass<S, Tin, KD, kThreads>(p, ck, hv, s.ks, Sm::ld_raw, s.gs, Sm::ldg, s.rk, s.rq, be);
      if (16 * wt.i < ck.len)
        gla_anchored_products<S, KD>(p, ck.len, s.gs, Sm::ldg, reinterpret_cast<const float*>(s.ks), Sm::ld_raw, aqk, wt.i,
                                     wt.lo, wt.hi);
      return;  // gcum went out with the pass
    }
    write_gated_rows<S>(p, ck, hv, s);
  } else {
    __syncthreads();
  }
  const int n = 16 * wt.i;
  if (n < ck.len) {
    bool diag_mma = true;
    if constexpr (kKDA) diag_mma = block_gate_range<KD>(s.gs, s.ldg, n, min(n + 15, ck.len - 1)) <= kMaxAnchorSpread;
    row_block_products<S, kDelta>(p, ck.len, s, aqk, wt, diag_mma);
    if constexpr (kKDA)  // the whole diagonal block, by the one warp of the row block holding n-tile 2i
      if (!diag_mma && wt.lo <= 2 * wt.i && 2 * wt.i < wt.hi) diagonal_block_pairwise<S, kDelta>(p, ck.len, s, aqk, wt.i);
  }
  if constexpr (kDelta) {  // gla: P = I, neither solved nor written
    __syncthreads();
    solve_unit_lower<S, kThreads>(s.Ls, s.Ps, s.Xs);
    float4* P4 = reinterpret_cast<float4*>(p.P + tile);
    for (int idx = threadIdx.x; idx < kChunk * kChunk / 4; idx += kThreads) {
      const float* src = s.Ps + (idx / 16) * kLdL + 4 * (idx % 16);
      P4[idx] = make_float4(operand_store<S>(src[0]), operand_store<S>(src[1]), operand_store<S>(src[2]), operand_store<S>(src[3]));
    }
    if constexpr (!kKDA && !S)
      if (p.kkt_writes_w) write_w(p, ck, hv, s);
  }
  // The gate tile (read-only since load_tiles, never aliased) for the later stages, stored last: kept
  // forwards write every row, and with those stores in front of the products gla's fwd+bwd (keep) at
  // T = 8192 was 0.045 ms slower than with the cumsum stage; stored here, it is not (twenty-first
  // session, calls 1-3).
  if constexpr (kKDA) store_gate_tile<KD, kThreads>(p, ck, hv, s.gs, s.ldg);
}

template <class Tin, int KD, bool kKDA, bool kDelta = true>
void launch(const ChunkParams& p, cudaStream_t stream) {
  using Sm = KktSmem<Tin, KD, kKDA>;
  const size_t smem = kDelta ? Sm::bytes : Sm::bytes - Sm::bytes_lmat;
  launch_kernel(chunk_kkt_kernel<Tin, KD, kKDA, kDelta>, dim3(front_chunks(p), p.HV), kkt_threads<kKDA>, smem, stream, p);
}

}  // namespace

void launch_chunk_kkt(const ChunkParams& cp, int input_dtype, cudaStream_t stream, bool with_w) {
  if (front_chunks(cp) <= 0) return;
  KCP_CHECK(!with_w || (!cp.kda && input_dtype != kF32 && cp.w && cp.K % 32 == 0),
            "cuda-chunkwise: kkt writes w for gdn with 16-bit inputs only, into an allocated w");
  ChunkParams p = cp;
  p.kkt_writes_w = with_w;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      if (p.gla) launch<Tin, KD, true, false>(p, stream);
      else if (p.kda) launch<Tin, KD, true>(p, stream);
      else launch<Tin, KD, false>(p, stream);
    });
  });
}

}  // namespace kcp::cuda
