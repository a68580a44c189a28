// Backward stage "dhu" (FLA chunk_gated_delta_rule_bwd_dhu; CPU twin chunk_bwd_dAv +
// chunk_state_backward), part 2 of 2: the serial recurrence. One block of 256 threads per
// (sequence n, value head hv, BV = 16 or 32 state columns [v0, v0 + BV)), walking the chunks of n last
// to first with dh [K,BV] exact in registers (each thread's update positions; its TF32 operand copy in
// shared memory, chunk_bwd_dhu_tiles.cuh); the chunk-local terms come from part 1 (chunk_bwd_dhu_local.cu):
//   dh[c]  = dh                                        (kept for the chunk stage)
//   dvnew  = A_c + kg dh                  [L,BV]       A_c = Aqk^T do,  kg_r = kn_r 2^(b_end - b_r), kn = k rstd_k
//   dh    <- Diag(2^b_end) dh + B_c - w^T dvnew,       B_c = scale qg^T do,  qg_r = qn_r 2^(b_r)
// (b: the chunk-local gate cumsum in log2 units, per channel for kda; every exponent <= 0.)
// gdn with bf16 q, k, do (BwdParams::dhu_forms_local): A_c and B_c are formed here from the forward's
// Aqk tile and the chunk's q and do rows, copied with k's (dhu_chain_ac; dhu_scale_do, dhu_chain_bc),
// and dhu_local does not run.
// dh starts from d_final_state (or 0); for the CP transition (kInitTransition) one launch carries
// dS_ext (columns [0, V), from 0, with do) and M^T (columns [V, V + K), from I, no A_c, B_c). After chunk 0 dh is written to dh0. The next chunk's kg, w arrive by
// cp.async, issued by a loader warpgroup of 128 threads after the chain's 256 (w's copies after the key halves' join, dhu_fetch_w; dhu_load_chunks) and its A_c, B_c by loads into registers (each thread's accumulator positions) while the
// current chunk is computed (gdn with bfloat16 k: k's rows and the row factors f_r = rstd_k 2^(b_end - b_r)
// instead of kg, dvnew = A_c + Diag(f) (k dh): chunk_bwd.cuh dhu_reads_raw_k); the products on tensor cores (3xTF32 where bwd_split_products says so,
// else one TF32 product: dh stays float32, only its operand copy is rounded; dvnew's shared copy,
// only ever a product operand, is stored rounded, and w arrives rounded (chunk_wy.cu stores it so
// when the inputs are 16-bit, which unsplit products imply): their fragments load unconverted). BV = 32 where the grid still has
// about a block per multiprocessor (the joint transition: V + K columns), else 16.
// gla (ChunkParams::gla) runs chunk_bwd_dh_gla.cu instead (w = 0: no product inside the chain).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, end to end, and the
// transitions).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_dhu_tiles.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/chunk_rows.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

namespace {

using namespace dhu;

// The loader warpgroup after the chain's kBwdThreads threads issues every cp.async of a step: ncu put
// ~160 of the chain's 686 warp instructions a step and ~26% of its stall samples in its copies
// (fifty-first session). With the loader (fifty-second, ncu, gdn T = 8192 H = 16): dhu 326 -> 300 us on
// an H200, 323 -> 300 on an H100. Not kept: also staging the kept dh[c] in shared memory for the loader
// to store (its four global stores a thread, after which the chain waited to reuse their address
// registers): 300 us either way.
constexpr int kLoaderThreads = 128, kDhuThreads = kBwdThreads + kLoaderThreads;

// The row copies of dhu_fetch; kFull: a full chunk (no row tests: every chunk of a sequence but its last).
// kBc (dhu_forms_local): q's bf16 rows and do's columns [v0, v0 + BV) too.
template <int KD, int BV, bool kRaw, bool kBc, bool kFull>
__device__ __forceinline__ void dhu_fetch_rows(const BwdParams& bp, const DhuSmem<KD, BV>& s, int b, const ChunkInfo& ck,
                                               int hv, int h, int v0, int tid) {
  using S = DhuSmem<KD, BV>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, ldx = p.HV * KD;  // kg, w: [TT,HV,K]
  if constexpr (kRaw) {
    const auto* k = static_cast<const __nv_bfloat16*>(p.k.p) + (ck.t0 * p.k.st + int64_t(h) * p.k.sx);
    copy_rows_async<kChunk, 2 * KD, kLoaderThreads, kFull>(s.k16(b), 2 * S::ldk, L, k, int(p.k.st), tid);
  } else {
    copy_rows_async<kChunk, 4 * KD, kLoaderThreads, kFull>(s.kg(b), S::ldk, L, bp.dkv + (int64_t(ck.t0) * p.HV + hv) * KD, ldx,
                                                          tid);
  }
  if constexpr (kBc) {
    const auto* q = static_cast<const __nv_bfloat16*>(p.q.p) + (ck.t0 * p.q.st + int64_t(h) * p.q.sx);
    copy_rows_async<kChunk, 2 * KD, kLoaderThreads, kFull>(s.q16(b), 2 * S::ldk, L, q, int(p.q.st), tid);
    const auto* dO = static_cast<const __nv_bfloat16*>(bp.d_o.p) + (ck.t0 * bp.d_o.st + int64_t(hv) * bp.d_o.sx + v0);
    copy_rows_async<kChunk, 2 * BV, kLoaderThreads, kFull>(s.do16(b), S::ldo, L, dO, int(bp.d_o.st), tid);
  }
}

// cp.async of chunk ck's tiles into buffer b: kg (raw: k's bf16 rows, with the gate and rstd_k rows),
// b_end (w: dhu_fetch_w). Each thread copies fixed row segments (copy_rows_async: addresses stepped
// by a constant; the per-element index arithmetic was ~30% of the step's instructions, ncu). h: the
// q/k head of value head hv (formed once by the caller: an integer division per step otherwise).
template <int KD, int BV, bool kKDA, bool kRaw, bool kBc>
__device__ void dhu_fetch(const BwdParams& bp, const DhuSmem<KD, BV>& s, int b, const ChunkInfo& ck, int c, int hv, int h,
                          int v0, int tid) {
  using S = DhuSmem<KD, BV>;
  const ChunkParams& p = bp.c;
  const int L = ck.len;
  if constexpr (kBc) {  // the forward's Aqk tile of chunk c (rows and columns >= L zero)
    // Row r only up to the end of its 16-row block's columns: dhu_chain_ac reads rows t >= m0 of the
    // column block [m0, m0 + 16), so the blocks right of the diagonal (kkt's zeros) are never read.
    // 10 of the tile's 16 KB a step; the chain shares L2 with its seven sibling blocks of the head (ncu:
    // L2 throughput 84% of peak at gdn T = 8192, H = 16).
    const float* A = p.Aqk + (int64_t(c) * p.HV + hv) * kChunk * kChunk;
    for_own_segments<kChunk, 4 * kChunk, kLoaderThreads>(
        [&](int r, int sg) {
          if (sg < 4 * (r / 16 + 1)) cp_async16(s.aqk(b) + r * S::lda + 4 * sg, A + r * kChunk + 4 * sg, true);
        },
        tid);
  }
  if (L == kChunk) dhu_fetch_rows<KD, BV, kRaw, kBc, true>(bp, s, b, ck, hv, h, v0, tid);
  else dhu_fetch_rows<KD, BV, kRaw, kBc, false>(bp, s, b, ck, hv, h, v0, tid);
  if constexpr (kRaw)
    load_chunk_row_scalars<false, false, kBc>(p, ck, hv, h, s.rows(b), nullptr, s.rows(b) + kChunk, s.rows(b) + 2 * kChunk,
                                              tid, kLoaderThreads);
  const float* ge = p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * (kKDA ? KD : 1);
  if constexpr (kKDA) {
    for (int idx = tid; idx < KD / 4; idx += kLoaderThreads) cp_async16(s.ge(b) + 4 * idx, ge + 4 * idx, true);
  } else if (tid == 0) {
    cp_async4(s.ge(b), ge, true);
  }
  cp_async_commit();
}

// cp.async of chunk ck's w rows into buffer b (rows >= L zero; gla: none, w = 0), a commit group of
// their own: issued after the key halves' join of the step before the chunk's, waited before the
// chunk's update (the wait before the update's barrier), about a step and a half later. With the
// step's other copies at its top, k dh's first shared loads queued behind w's 2048 16-byte copies a
// block. One H200, T = 8192, ncu: gdn (bf16, dhu_forms_local) dhu 434-437 -> 422-430 us (stage
// 1.353-1.373 -> 1.326-1.339 ms at T = 32768); gdn float32 and kda level (496 -> 491-501, 404 -> 394-408).
template <int KD, int BV>
__device__ __forceinline__ void dhu_fetch_w(const BwdParams& bp, const DhuSmem<KD, BV>& s, int b, const ChunkInfo& ck, int hv,
                                            int tid) {
  using S = DhuSmem<KD, BV>;
  const ChunkParams& p = bp.c;
  const float* w = p.w + (int64_t(ck.t0) * p.HV + hv) * KD;
  if (!p.gla) {
    if (ck.len == kChunk) copy_rows_async<kChunk, 4 * KD, kLoaderThreads, true>(s.w(b), S::ldw, kChunk, w, p.HV * KD, tid);
    else copy_rows_async<kChunk, 4 * KD, kLoaderThreads, false>(s.w(b), S::ldw, ck.len, w, p.HV * KD, tid);
  }
  cp_async_commit();  // an empty group for gla: every step commits two
}

// c += a b where a's values are exact TF32 (k's bf16 rows; its split low part is zero): the split
// product drops the a.lo term.
template <bool S>
__device__ __forceinline__ void mma_exact_a(float (&c)[4], const FragA<false>& a, const FragB<S>& b) {
  if constexpr (S) mma_tf32(c, a.hi, b.lo);
  mma_tf32(c, a.hi, b.hi);
}

// This warp's k dh over its key half [k0w, k0w + KP) (raw k: k's bf16 rows, in the permuted k order of
// ldm_a_row16_perm, dh's rows read to match: B(k0 + t, n) = dh row k0 + 2t, B(k0 + t + 4, n) = row
// k0 + 2t + 1) or kg dh, added to c over the even k steps and to c2 over the odd ones (two dependent
// chains of KP / 16 a column tile). Each lane's B
// elements come from one base, every k step a constant offset (the loop unrolled: an index formula of a
// run-time k0 cost ~60 integer instructions a k step, ncu).
template <int KD, int BV, bool kSp, bool kRaw>
__device__ __forceinline__ void dhu_k_dh(const DhuSmem<KD, BV>& s, int b, int m0, float (&c)[DhuTiling<KD, BV>::NV][4],
                                         float (&c2)[DhuTiling<KD, BV>::NV][4]) {
  using S = DhuSmem<KD, BV>;
  using Tl = DhuTiling<KD, BV>;
  constexpr int ldh = kLdDh<BV, kRaw>, kOdd = kRaw ? 1 : 4;  // the row of B's second element
  const int k0w = Tl::KP * Tl::khalf();
  const float* db = s.dh + ((kRaw ? 2 : 1) * lane_t() + k0w) * ldh + lane_g();
  auto bfrag = [&](int k0, int j) {
    FragB<kSp> f;
    f.set_exact(0, db[k0 * ldh + Tl::nv(j)]), f.set_exact(1, db[(k0 + kOdd) * ldh + Tl::nv(j)]);  // dhu_store_state
    return f;
  };
  const __nv_bfloat16* ka = ldm_row16_lane(s.k16(b), 2 * S::ldk, m0) + k0w;
#pragma unroll
  for (int k0 = 0; k0 < Tl::KP; k0 += 16) {
    if constexpr (kRaw) {
      const FragA<false> a0 = ldm_a_row16_perm_lane(ka, k0), a1 = ldm_a_row16_perm_lane(ka, k0 + 8);
#pragma unroll
      for (int j = 0; j < Tl::NV; ++j) mma_exact_a<kSp>(c[j], a0, bfrag(k0, j)), mma_exact_a<kSp>(c2[j], a1, bfrag(k0 + 8, j));
    } else {
      const FragA<kSp> a0 = ldm_a_row<kSp>(s.kg(b), S::ldk, m0, k0w + k0, false);  // row-major, ldk = 4 mod 32
      const FragA<kSp> a1 = ldm_a_row<kSp>(s.kg(b), S::ldk, m0, k0w + k0 + 8, false);
#pragma unroll
      for (int j = 0; j < Tl::NV; ++j) mma<kSp>(c[j], a0, bfrag(k0, j)), mma<kSp>(c2[j], a1, bfrag(k0 + 8, j));
    }
  }
}

// Key half 1 hands its partial k dh to half 0's warp of the same row block through the dvn tile (free
// until the update; each element read and then overwritten by the one thread of half 0 that holds it).
// Returns whether this warp finishes the tile (half 0).
template <int KD, int BV>
__device__ __forceinline__ bool dhu_join_halves(const DhuSmem<KD, BV>& s, float (&c)[DhuTiling<KD, BV>::NV][4]) {
  using Tl = DhuTiling<KD, BV>;
  constexpr int ld = kLdB<BV>;
  float* part = s.dvn + acc_row(Tl::mv(), 0) * ld + acc_col(0, 0);  // tile j, element e: + (e >> 1) 8 ld + 8 j + (e & 1)
  if (Tl::khalf() == 1) {
#pragma unroll
    for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) *reinterpret_cast<float2*>(part + (e >> 1) * 8 * ld + 8 * j) = make_float2(c[j][e], c[j][e + 1]);
  }
  // The block's barrier: a named barrier of the row block's two warps (bar.arrive / bar.sync) timed
  // level with it (one H200, 2026-12-01) and drew racecheck reports that this form does not.
  __syncthreads();
  if (Tl::khalf() == 1) return false;
#pragma unroll
  for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float2 x = *reinterpret_cast<const float2*>(part + (e >> 1) * 8 * ld + 8 * j);
      c[j][e] += x.x, c[j][e + 1] += x.y;
    }
  return true;
}

// Raw k's row factors f_r = rstd_k 2^(b_end - b_r) of this thread's dvnew rows m0 + g and m0 + g + 8.
template <int KD, int BV>
__device__ __forceinline__ void raw_row_factors(const DhuSmem<KD, BV>& s, int b, int m0, float (&f)[2]) {
  const float* g = s.rows(b);
  const float be = s.ge(b)[0];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m0 + lane_g() + 8 * h;
    f[h] = g[kChunk + r] * exp2f(be - g[r]);
  }
}

// dvnew = A_c + kg dh on tensor cores (3xTF32 when kSp); raw k: A_c + Diag(f) (k dh), f_r = rstd_k
// 2^(b_end - b_r) (rows >= L: k's rows are zero, and f is finite, 1 or 0: dhu_fetch). Key half 0's
// warps finish the tile. kLoc (dhu_forms_local): each half forms its part of A_c (dhu_chain_ac) and
// applies f to its own k dh part, so the halves' sums meet complete.
template <int KD, int BV, bool kSp, bool kRaw, bool kLoc>
__device__ void dhu_dvnew(const BwdParams& bp, const DhuSmem<KD, BV>& s, int b, const ChunkInfo& ck, int hv, int v0,
                          const LocalTerms<KD, BV>& lt) {
  using Tl = DhuTiling<KD, BV>;
  constexpr int ld = kLdB<BV>;
  const int m0 = Tl::mv();
  float c[Tl::NV][4], c2[Tl::NV][4], ac[Tl::NV][4] = {};
  if constexpr (kLoc) dhu_chain_ac<KD, BV>(s, b, m0, ac);  // independent of dh: its loads before k dh's
#pragma unroll
  for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[j][e] = kRaw ? 0.0f : lt.a[j][e], c2[j][e] = 0.0f;  // lt.a: zero in half 1
  dhu_k_dh<KD, BV, kSp, kRaw>(s, b, m0, c, c2);
#pragma unroll
  for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[j][e] += c2[j][e];
  float f[2];
  if constexpr (kLoc) {
    raw_row_factors(s, b, m0, f);
#pragma unroll
    for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[j][e] = fmaf(f[e >> 1], c[j][e], ac[j][e]);
  }
  if (!dhu_join_halves<KD, BV>(s, c)) return;
  if constexpr (kRaw && !kLoc) {  // the row factors f of raw k, then A_c
    raw_row_factors(s, b, m0, f);
#pragma unroll
    for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[j][e] = fmaf(f[e >> 1], c[j][e], lt.a[j][e]);
  }
#pragma unroll
  for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // elements e, e + 1: columns col, col + 1 of row r
      const int r = acc_row(m0, e), col = acc_col(Tl::nv(j), e);
      *reinterpret_cast<float2*>(s.dvn + r * ld + col) = make_float2(operand_store<kSp>(c[j][e]), operand_store<kSp>(c[j][e + 1]));
      if (bp.dvnew && bp.keep && r < ck.len)
        *reinterpret_cast<float2*>(bp.dvnew + (int64_t(ck.t0 + r) * bp.c.HV + hv) * bp.Vw + v0 + col) = make_float2(c[j][e], c[j][e + 1]);
    }
}

// dh <- Diag(2^b_end) dh + B_c - w^T dvnew on tensor cores (3xTF32 when kSp), accumulated negated,
// -dh = (-Diag(2^b_end) dh - B_c) + w^T dvnew, so that w's fragments load without a negation each.
// The exact dh comes from and goes back to this thread's registers d (DhState); its shared copy,
// read only by the next step's k dh (after the loop's barrier), is written in place: no barrier here.
template <int KD, int BV, bool kKDA, bool kSp, bool kRaw>
__device__ void dhu_update(const DhuSmem<KD, BV>& s, int b, int L, const LocalTerms<KD, BV>& lt, DhState<KD, BV>& d) {
  using S = DhuSmem<KD, BV>;
  using Tl = DhuTiling<KD, BV>;
  constexpr int ld = kLdB<BV>;
  const float* wt = s.w(b);
  float c[Tl::MW][Tl::NU][4];
#pragma unroll
  for (int q = 0; q < Tl::MW; ++q) {
    const int m0 = Tl::mu(q);
#pragma unroll
    for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {  // elements e, e + 1: adjacent columns of row i
        const float f = exp2f(s.ge(b)[kKDA ? acc_row(m0, e) : 0]);
        c[q][nt][e] = -fmaf(f, d.x[q][nt][e], lt.b[q][nt][e]), c[q][nt][e + 1] = -fmaf(f, d.x[q][nt][e + 1], lt.b[q][nt][e + 1]);
      }
    float c2[Tl::NU][4] = {};  // the odd k steps: two dependent chains of L / 16
    auto wT = [&](int m, int k) { return wt[k * S::ldw + m]; };
    auto dv = [&](int k, int n) { return s.dvn[k * ld + n]; };
    auto step = [&](int k0, bool odd) {
      const FragA<kSp> a0 = load_a<kSp, true>(wT, m0, k0);
#pragma unroll
      for (int nt = 0; nt < Tl::NU; ++nt) mma<kSp>(c[q][nt], a0, load_b<kSp, true>(dv, k0, 8 * nt));
      if (odd) {
        const FragA<kSp> a1 = load_a<kSp, true>(wT, m0, k0 + 8);
#pragma unroll
        for (int nt = 0; nt < Tl::NU; ++nt) mma<kSp>(c2[nt], a1, load_b<kSp, true>(dv, k0 + 8, 8 * nt));
      }
    };
    if (L == kChunk) {  // a full chunk (all but a sequence's last): unrolled, constant offsets
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16) step(k0, true);
    } else {
      for (int k0 = 0; k0 < L; k0 += 16) step(k0, k0 + 8 < L);
    }
#pragma unroll
    for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[q][nt][e] += c2[nt][e];
  }
#pragma unroll
  for (int q = 0; q < Tl::MW; ++q)
#pragma unroll
    for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d.x[q][nt][e] = -c[q][nt][e];
  dhu_store_state<KD, BV, kSp, kRaw>(s, d);
}

// The loader warpgroup's walk: the chain's copies in the chain's order (chunk c - 1's rows after the
// step's first barrier, its w after the key halves' join), waiting for chunk c's rows before the first
// barrier and for its w before the update's; it takes part in the chain's three block barriers a step
// (the first, dhu_join_halves', the update's). Each step commits two groups, as the chain did.
template <int KD, int BV, bool kKDA, bool kRaw, bool kBc>
__device__ void dhu_load_chunks(const BwdParams& bp, const DhuSmem<KD, BV>& s, int n, int hv, int v0) {
  const ChunkParams& p = bp.c;
  const int tid = int(threadIdx.x) - kBwdThreads, h = hv / p.G;
  const int c_hi = p.seq_chunk0[n + 1] - 1, c_lo = p.seq_chunk0[n];
  if (c_hi < c_lo) return;
  ChunkInfo ck = p.chunks[c_hi];
  dhu_fetch<KD, BV, kKDA, kRaw, kBc>(bp, s, 0, ck, c_hi, hv, h, v0, tid);
  dhu_fetch_w<KD, BV>(bp, s, 0, ck, hv, tid);
  for (int c = c_hi, b = 0; c >= c_lo; --c, b ^= 1) {
    const ChunkInfo ckp = c > c_lo ? p.chunks[c - 1] : ck;
    cp_async_wait<1>();  // chunk c's rows (its w may be pending)
    __syncthreads();     // the chain's first barrier: buffer b ^ 1 is free
    if (c > c_lo) dhu_fetch<KD, BV, kKDA, kRaw, kBc>(bp, s, b ^ 1, ckp, c - 1, hv, h, v0, tid);
    else cp_async_commit();
    __syncthreads();  // the chain's join of its key halves (dhu_join_halves)
    if (c > c_lo) dhu_fetch_w<KD, BV>(bp, s, b ^ 1, ckp, hv, tid);
    else cp_async_commit();
    cp_async_wait<2>();  // chunk c's w (pending: chunk c - 1's rows and w)
    __syncthreads();     // the chain's barrier before its update
    ck = ckp;
  }
}

// kBc: A_c and B_c formed in the chain (dhu_forms_local; kRaw, unsplit), not loaded.
template <int KD, int BV, bool kKDA, bool kSplit, bool kRaw, bool kBc>
__global__ void __launch_bounds__(kDhuThreads, 1) bwd_dhu_kernel(const __grid_constant__ BwdParams bp) {
  static_assert(!kBc || (kRaw && !kSplit), "A_c, B_c in the chain: raw k rows, one TF32 product");
  const ChunkParams& p = bp.c;
  const int n = blockIdx.x, hv = blockIdx.y, v0 = blockIdx.z * BV;
  extern __shared__ __align__(16) float smem[];
  const DhuSmem<KD, BV> s(smem);
  if (threadIdx.x >= kBwdThreads) return dhu_load_chunks<KD, BV, kKDA, kRaw, kBc>(bp, s, n, hv, v0);
  const bool local = bp.d_o.p != nullptr && v0 < p.V;  // the columns with do (the M^T columns have none)
  DhState<KD, BV> d;
  d.init(bp, n, hv, v0);
  dhu_store_state<KD, BV, kSplit, kRaw>(s, d);
  const int c_hi = p.seq_chunk0[n + 1] - 1, c_lo = p.seq_chunk0[n];
  // The chunk table is read a chunk ahead (ck: chunk c, ckn: c - 1, loaded while c + 1 ran), so no
  // step waits on it before its loads can be addressed.
  const typename LocalTerms<KD, BV>::Addr ad(bp, hv, v0, local);
  LocalTerms<KD, BV> cur, nxt;
  ChunkInfo ck = {}, ckn = {};
  if (c_hi >= c_lo) {
    ck = p.chunks[c_hi];
    ckn = c_hi > c_lo ? p.chunks[c_hi - 1] : ck;
    if constexpr (!kBc) cur.load(bp, ad, ck, c_hi);
  }
  for (int c = c_hi, b = 0; c >= c_lo; --c, b ^= 1) {
    __syncthreads();  // buffer b's rows have arrived (the loader's wait); buffer b ^ 1 and dvn are free
    const ChunkInfo ckp = ckn;  // chunk c - 1
    if (c > c_lo) {
      if constexpr (!kBc) nxt.load(bp, ad, ckp, c - 1);
      if (c - 1 > c_lo) ckn = p.chunks[c - 2];
    }
    if (bp.dh && bp.keep) {  // dh[c] from the registers (this thread loaded B_c's slot c at these positions a step ago)
      float* g = bp.dh + (int64_t(c) * p.HV + hv) * KD * bp.Vw + v0;
      d.for_owned([&](int q, int nt, int e, int i, int j) {
        *reinterpret_cast<float2*>(g + int64_t(i) * bp.Vw + j) = make_float2(d.x[q][nt][e], d.x[q][nt][e + 1]);
      });
    }
    if constexpr (kBc) dhu_scale_do<KD, BV>(p.scale, s, b);  // read after dhu_dvnew's barrier
    dhu_dvnew<KD, BV, kSplit, kRaw, kBc>(bp, s, b, ck, hv, v0, cur);  // (its join: a block barrier)
    if constexpr (kBc) dhu_chain_bc<KD, BV>(s, b, cur.b);  // key half 1 while half 0 finishes dvnew
    __syncthreads();  // chunk c's w has arrived (the loader's wait)
    dhu_update<KD, BV, kKDA, kSplit, kRaw>(s, b, p.gla ? 0 : ck.len, cur, d);  // gla: no w^T dvnew term (w = 0)
    if constexpr (!kBc) cur = nxt;
    ck = ckp;
  }
  if (bp.dh0.p)
    d.for_owned([&](int q, int nt, int e, int i, int j) {
      const int64_t o = n * bp.dh0.sn + hv * bp.dh0.shv + i * bp.dh0.si + (v0 + j) * bp.dh0.sj;
      store_any(bp.dh0.p, bp.dh0.dt, o, d.x[q][nt][e]), store_any(bp.dh0.p, bp.dh0.dt, o + bp.dh0.sj, d.x[q][nt][e + 1]);
    });
}

}  // namespace

void launch_bwd_dhu_serial(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.N == 0) return;
  const bool joint = bp.init == kInitTransition;
  KCP_CHECK(bp.Vw % 16 == 0 && (!joint || (p.V % 32 == 0 && bp.Vw == p.V + p.K)),
            "cuda-chunkwise backward: state columns ", bp.Vw, " must be a multiple of 16 (joint transition: V + K, V a multiple of 32)");
  KCP_CHECK(!bp.d_o.p || (bp.dh && bp.dvnew && (bp.Vw == p.V || joint)),
            "cuda-chunkwise backward: dhu with do needs the dh and dvnew buffers");
  KCP_CHECK(!bp.keep || bp.Vw == p.V || !(bp.dh || bp.dvnew), "cuda-chunkwise backward: dh[c], dvnew kept only for V columns");
  KCP_CHECK(!bp.dhu_forms_local || dhu_forms_local_applies(bp), "cuda-chunkwise backward: dhu_forms_local set for a call it does not apply to");
  if (p.gla) return launch_bwd_dhu_gla(bp, stream);  // w = 0: an elementwise scan (chunk_bwd_dh_gla.cu)
  // 32 columns per block when that still gives about a block per multiprocessor (the chain steps of
  // two 16-column blocks then share one block's loads and barriers), else 16.
  const bool wide = bp.Vw % 32 == 0 && int64_t(bp.Vw / 32) * p.N * p.HV >= multiprocessors(p) * 3 / 4;
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    constexpr bool kS = decltype(split)::value;
    auto run = [&](auto bv) {
      constexpr int BV = decltype(bv)::value;
      const size_t smem = sizeof(float) * DhuSmem<KD, BV>::floats;
      const dim3 grid(p.N, p.HV, bp.Vw / BV);
      if (p.kda) launch_kernel(bwd_dhu_kernel<KD, BV, true, kS, false, false>, grid, dim3(kDhuThreads), smem, stream, bp);
      else if (!dhu_reads_raw_k(p)) launch_kernel(bwd_dhu_kernel<KD, BV, false, kS, false, false>, grid, dim3(kDhuThreads), smem, stream, bp);
      else if constexpr (!kS) {  // braces: bp.dhu_forms_local implies unsplit products
        if (bp.dhu_forms_local)  // with the Aqk tiles
          launch_kernel(bwd_dhu_kernel<KD, BV, false, kS, true, true>, grid, dim3(kDhuThreads),
                        sizeof(float) * DhuSmem<KD, BV>::floats_local, stream, bp);
        else launch_kernel(bwd_dhu_kernel<KD, BV, false, kS, true, false>, grid, dim3(kDhuThreads), smem, stream, bp);
      } else {
        launch_kernel(bwd_dhu_kernel<KD, BV, false, kS, true, false>, grid, dim3(kDhuThreads), smem, stream, bp);
      }
    };
    if (wide) run(std::integral_constant<int, 32>{});
    else run(std::integral_constant<int, 16>{});
  });
}

}  // namespace kcp::cuda
