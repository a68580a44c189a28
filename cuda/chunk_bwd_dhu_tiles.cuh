// The dhu chain's layouts and per-thread register state (chunk_bwd_dhu.cu, the backward's serial
// state-gradient recurrence): the shared-memory tiles (dh's operand copy [K, BV], the dvnew tile
// [64, BV], two buffers of kg or k's bf16 rows [64, K], w [64, K], b_end and the raw gate rows), the
// warps' tiles (dvnew over two key halves, the update over row blocks of 16), the exact dh in each
// thread's registers (DhState) and the chunk-local terms A_c, B_c loaded a chunk ahead (LocalTerms).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, end to end, and the
// transitions).
#pragma once

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda::dhu {

// [rows][BV] tiles read as k-major B fragments: row stride 8 or 24 mod 32 words (conflict-free)
template <int BV>
constexpr int kLdB = BV == 16 ? 24 : BV + 8;
// dh's row stride: kLdB, or with raw k (kRaw) 4 mod 16 words, since the B fragments of k dh then read
// rows k0 + 2t and k0 + 2t + 1 (the permuted k order of ldm_a_row16_perm): 2 ld = 8 mod 32 keeps
// those eight rows on distinct banks. Never above kLdB (the allocation).
template <int BV, bool kRaw>
constexpr int kLdDh = kRaw ? (BV == 16 ? 20 : BV + 4) : kLdB<BV>;

template <int KD, int BV>
struct DhuSmem {
  static constexpr int ldk = KD + 4;  // kg [64][KD]: row-major A fragments (4 mod 32); raw k: bf16 rows of 2 ldk
  static constexpr int ldw = KD + 8;  // w [64][KD]: transposed A fragments (8 mod 32)
  // do's bf16 rows [64][BV] (dhu_forms_local), read by ldmatrix.trans: a row stride of an odd multiple of
  // 16 bytes keeps the eight rows of a matrix on distinct banks
  static constexpr int ldo = BV + 8;
  static constexpr int buf = kChunk * ldk + kChunk * ldw + KD + 3 * kChunk + kChunk * ldo / 2;
  static constexpr int floats = KD * kLdB<BV> + kChunk * kLdB<BV> + 2 * buf + kChunk * ldo;
  // with the forward's Aqk tiles [2][64][64] at the end (dhu_forms_local): 2 lda = 8 mod 32 words, so the
  // transposed A fragments' scalar loads (rows k0 + 2t, columns m0 + g) fall on distinct banks
  static constexpr int lda = kChunk + 4;
  static constexpr int floats_local = floats + 2 * kChunk * lda;
  float *dh, *dvn, *b0;
  __device__ explicit DhuSmem(float* s) : dh(s), dvn(s + KD * kLdB<BV>), b0(s + (KD + kChunk) * kLdB<BV>) {}
  // buffer b (0, 1): kg (or k's bf16 rows), w, b_end [KD], raw k's gate rows b_r, rstd_k and rstd_q
  // [3][64] (load_chunk_row_scalars: past the chunk's length the last gate row, rstd 0, or 1 without
  // the norm), do's rows. q's bf16 rows (dhu_forms_local) share the raw k rows' 2 ldk bf16, from KD + 8
  // (16-byte aligned; KD + 8 + KD = 2 ldk).
  __device__ float* kg(int b) const { return b0 + b * buf; }
  __device__ __nv_bfloat16* k16(int b) const { return reinterpret_cast<__nv_bfloat16*>(kg(b)); }
  __device__ __nv_bfloat16* q16(int b) const { return k16(b) + KD + 8; }
  __device__ float* w(int b) const { return kg(b) + kChunk * ldk; }
  __device__ float* ge(int b) const { return w(b) + kChunk * ldw; }
  __device__ float* rows(int b) const { return ge(b) + KD; }
  __device__ __nv_bfloat16* do16(int b) const { return reinterpret_cast<__nv_bfloat16*>(rows(b) + 3 * kChunk); }
  // do's rows times their factors as bf16 hi and lo parts [64][BV] (dhu_scale_do), one step's
  __device__ __nv_bfloat16* dohi() const { return reinterpret_cast<__nv_bfloat16*>(b0 + 2 * buf); }
  __device__ __nv_bfloat16* dolo() const { return dohi() + kChunk * ldo; }
  __device__ float* aqk(int b) const { return b0 + 2 * buf + kChunk * ldo + b * kChunk * lda; }
};

// Warp tiles: dvnew [64, BV]: rows 16 (w % 4), every 8-column tile, over the keys [KP (w / 4), + KP)
// (two key halves: k's rows are read once a step, not once per column half, 48 KB of operands a step
// instead of 64; the halves' partial sums meet in shared memory, dhu_join_halves); the update [KD, BV]:
// rows 16 (w + 8 q), every 8-column tile.
template <int KD, int BV>
struct DhuTiling {
  static constexpr int NV = BV / 8, KP = KD / 2, MT = KD / 16, MW = (MT + 7) / 8, NU = BV / 8;
  static_assert(KP % 16 == 0, "dhu's key halves");
  __device__ static int mv() { return 16 * (int(threadIdx.x >> 5) & 3); }
  __device__ static int nv(int j) { return 8 * j; }
  __device__ static int khalf() { return int(threadIdx.x >> 5) >> 2; }
  __device__ static int mu(int q) { return 16 * min(int(threadIdx.x >> 5) + 8 * q, MT - 1); }
};

// The exact dh at this thread's update positions (row acc_row(mu(q), e), column acc_col(8 nt, e)),
// carried in registers from step to step; the shared dh tile holds the operand copy for k dh (TF32-
// rounded unless the products are split: the rounding the tensor core applies anyway, so the k dh
// fragments load without a conversion each, and the update reads no dh from shared memory). Warps
// past the key rows (w + 8 q >= MT, K = 64) repeat the last row block and own nothing.
template <int KD, int BV>
struct DhState {
  using Tl = DhuTiling<KD, BV>;
  float x[Tl::MW][Tl::NU][4];
  // The chain's starting dh (dhu_init: d_final_state, 0, or the transition's I) at every position of
  // this thread, the repeated row blocks included.
  __device__ void init(const BwdParams& bp, int n, int hv, int v0) {
#pragma unroll
    for (int q = 0; q < Tl::MW; ++q)
#pragma unroll
      for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[q][nt][e] = dhu_init(bp, n, hv, acc_row(Tl::mu(q), e), v0 + acc_col(8 * nt, e));
  }
  // f(q, nt, e, i, j): each owned element, key row i, column j (pairs e, e + 1 adjacent).
  template <class F>
  __device__ __forceinline__ static void for_owned(F&& f) {
    const int w = threadIdx.x >> 5;
#pragma unroll
    for (int q = 0; q < Tl::MW; ++q) {
      if (w + 8 * q >= Tl::MT) continue;
#pragma unroll
      for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2) f(q, nt, e, acc_row(16 * (w + 8 * q), e), acc_col(8 * nt, e));
    }
  }
};

// B_c = scale qn^T Diag(2^b) do (dhu_forms_local) in two parts, on m16n8k16 bf16 tensor-core products:
// dhu_scale_do (every thread, after the step's first barrier) writes do' = Diag(f) do, f_r = scale
// rstd_q 2^(b_r), from buffer b's rows as two bf16 parts hi = bf16(do'), lo = bf16(do' - hi) (about 16
// bits of do', finer than the TF32 rounding of qg that dhu_local applies); after the barrier that joins
// the key halves, dhu_chain_bc (each warp, for its update positions: those of LocalTerms::b) forms
// q^T hi + q^T lo with q's exact bf16 rows. Both operands by ldmatrix.trans, no conversion: a few
// dozen instructions a warp and step, where f on q's TF32 fragments cost ~220 (ncu, call 1).
template <int KD, int BV>
__device__ __forceinline__ void dhu_scale_do(float scale, const DhuSmem<KD, BV>& s, int b) {
  using S = DhuSmem<KD, BV>;
  constexpr int CP = BV / 4;  // columns per thread: 4 threads a row, 64 rows
  static_assert(4 * kChunk == kBwdThreads, "one row per four threads");
  const int r = threadIdx.x / 4, c0 = CP * (threadIdx.x % 4);
  const float* g = s.rows(b);  // b_r, rstd_k, rstd_q
  const float f = scale * g[2 * kChunk + r] * exp2f(g[r]);
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(s.do16(b) + r * S::ldo + c0);
  __nv_bfloat162 hi[CP / 2], lo[CP / 2];
#pragma unroll
  for (int i = 0; i < CP / 2; ++i) {
    const float2 y = __bfloat1622float2(x[i]);
    const float y0 = y.x * f, y1 = y.y * f;
    hi[i] = __floats2bfloat162_rn(y0, y1);
    const float2 h = __bfloat1622float2(hi[i]);
    lo[i] = __floats2bfloat162_rn(y0 - h.x, y1 - h.y);
  }
  __nv_bfloat162* dh = reinterpret_cast<__nv_bfloat162*>(s.dohi() + r * S::ldo + c0);
  __nv_bfloat162* dl = reinterpret_cast<__nv_bfloat162*>(s.dolo() + r * S::ldo + c0);
#pragma unroll
  for (int i = 0; i < CP / 2; ++i) dh[i] = hi[i], dl[i] = lo[i];
}

template <int KD, int BV>
__device__ __forceinline__ void dhu_chain_bc(const DhuSmem<KD, BV>& s, int b,
                                             float (&bc)[DhuTiling<KD, BV>::MW][DhuTiling<KD, BV>::NU][4]) {
  using S = DhuSmem<KD, BV>;
  using Tl = DhuTiling<KD, BV>;
  const int l = threadIdx.x & 31, j = l >> 3;
  float acc[2][Tl::MW][Tl::NU][4] = {};  // the hi and lo parts: two independent chains
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += 16) {
    // B fragments (b0, b1) of column tiles 2i, 2i + 1: matrix j holds tokens k0 + 8 (j & 1), columns 8 (j >> 1)
    uint32_t bh[Tl::NU / 2][4], bl[Tl::NU / 2][4];
#pragma unroll
    for (int i = 0; i < Tl::NU / 2; ++i) {
      const int o = (k0 + 8 * (j & 1) + (l & 7)) * S::ldo + 16 * i + 8 * (j >> 1);
      ldsm_x4_trans(bh[i], s.dohi() + o), ldsm_x4_trans(bl[i], s.dolo() + o);
    }
#pragma unroll
    for (int q = 0; q < Tl::MW; ++q) {
      // A = q^T [16 keys, 16 tokens]: matrix j holds tokens k0 + 8 (j >> 1), keys mu(q) + 8 (j & 1)
      uint32_t a[4];
      ldsm_x4_trans(a, s.q16(b) + (k0 + 8 * (j >> 1) + (l & 7)) * (2 * S::ldk) + Tl::mu(q) + 8 * (j & 1));
#pragma unroll
      for (int nt = 0; nt < Tl::NU; ++nt) {
        mma_16bit<__nv_bfloat16>(acc[0][q][nt], a, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
        mma_16bit<__nv_bfloat16>(acc[1][q][nt], a, bl[nt / 2][2 * (nt % 2)], bl[nt / 2][2 * (nt % 2) + 1]);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < Tl::MW; ++q)
#pragma unroll
    for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) bc[q][nt][e] = acc[1][q][nt][e] + acc[0][q][nt][e];
}

// This key half's part of A_c = Aqk^T do for the dvnew rows [m0, m0 + 16), added to c (dhu_forms_local):
// Aqk is lower triangular (kkt writes zeros elsewhere), so the tokens t >= m0, the k steps from m0
// alternating between the halves. A = Aqk^T (TF32 values as kkt stores them) by scalar loads in the
// permuted k order of B = do's exact bf16 rows (ldmatrix.trans, position t: token k0 + 2t, t + 4:
// k0 + 2t + 1).
template <int KD, int BV>
__device__ __forceinline__ void dhu_chain_ac(const DhuSmem<KD, BV>& s, int b, int m0, float (&c)[DhuTiling<KD, BV>::NV][4]) {
  using S = DhuSmem<KD, BV>;
  using Tl = DhuTiling<KD, BV>;
  static_assert(Tl::NV == 2 || Tl::NV == 4, "one ldmatrix a k step");
  const int l = threadIdx.x & 31, g = lane_g(), t = lane_t();
  const float* A = s.aqk(b) + 2 * t * S::lda + m0 + g;
#pragma unroll
  for (int i = 0; i < kChunk / 16; ++i) {  // at most four k steps a half (m0 = 0)
    const int k0 = m0 + 8 * Tl::khalf() + 16 * i;
    if (k0 >= kChunk) break;
    FragA<false> a;
    a.hi[0] = __float_as_uint(A[k0 * S::lda]), a.hi[1] = __float_as_uint(A[k0 * S::lda + 8]);
    a.hi[2] = __float_as_uint(A[(k0 + 1) * S::lda]), a.hi[3] = __float_as_uint(A[(k0 + 1) * S::lda + 8]);
    uint32_t r[Tl::NV];  // matrix j: tokens k0 .. k0 + 7, columns 8 j ..
    const __nv_bfloat16* row = s.do16(b) + (k0 + (l & 7)) * S::ldo + 8 * ((l >> 3) % Tl::NV);
    if constexpr (Tl::NV == 2) {
      ldsm_x2_trans(r, row);
    } else {
      ldsm_x4_trans(r, row);
    }
#pragma unroll
    for (int j = 0; j < Tl::NV; ++j) {
      FragB<false> fb;
      fb.hi[0] = widen_lo<__nv_bfloat16>(r[j]), fb.hi[1] = widen_hi<__nv_bfloat16>(r[j]);
      mma<false>(c[j], a, fb);
    }
  }
}

template <int KD, int BV, bool kSp, bool kRaw>
__device__ __forceinline__ void dhu_store_state(const DhuSmem<KD, BV>& s, const DhState<KD, BV>& d) {
  constexpr int ldh = kLdDh<BV, kRaw>;
  d.for_owned([&](int q, int nt, int e, int i, int j) {
    *reinterpret_cast<float2*>(s.dh + i * ldh + j) = make_float2(operand_store<kSp>(d.x[q][nt][e]), operand_store<kSp>(d.x[q][nt][e + 1]));
  });
}

// The chunk-local terms of one chunk, in this thread's accumulator positions (registers): A_c for
// the dvnew tiles, B_c for the update tiles (read by each thread before the dh[c] store that reuses
// B_c's memory: a __syncthreads lies between, and loads before a barrier are performed before it).
// Each thread's offsets into A_c's rows ([TT,HV,V] in dvnew) and B_c's ([NT,HV,K,V] in dh) are formed
// once (LocalTerms::Addr); a step adds the chunk's base (the per-step 64-bit index arithmetic was most
// of the step's integer instructions, ncu).
template <int KD, int BV>
struct LocalTerms {
  using Tl = DhuTiling<KD, BV>;
  struct Addr {
    int64_t lda, ldb;  // A_c's row stride (HV V), B_c's chunk stride (HV K V)
    int a_off, b_off;  // this thread's first element of A_c (row mv + g, its column pair of tile 0) and of B_c (key row g)
    bool local, local_a;  // A_c: the key half 0 adds it
    __device__ Addr(const BwdParams& bp, int hv, int v0, bool with_do) {
      const ChunkParams& p = bp.c;
      const int g = lane_g(), c2 = 2 * lane_t();  // accumulator elements (e, e + 1) are adjacent columns
      lda = int64_t(p.HV) * p.V, ldb = lda * KD;
      a_off = (Tl::mv() + g) * int(lda) + hv * p.V + v0 + c2 + Tl::nv(0);
      b_off = (hv * KD + g) * p.V + v0 + c2;
      local = with_do, local_a = with_do && Tl::khalf() == 0;
    }
  };
  float a[Tl::NV][4], b[Tl::MW][Tl::NU][4];
  // (not where the chain forms the terms itself: dhu_forms_local)
  __device__ void load(const BwdParams& bp, const Addr& ad, const ChunkInfo& ck, int c) {
    const float* A = bp.dvnew + ck.t0 * ad.lda + ad.a_off;  // rows + 0 and + 8, tiles 8 columns apart
    const float* B = bp.dh + c * ad.ldb + ad.b_off;          // + row mu(q) (+ 8) times V, + 8 nt
    const int r = Tl::mv() + lane_g(), V = bp.c.V;
#pragma unroll
    for (int j = 0; j < Tl::NV; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 x = ad.local_a && r + 8 * h < ck.len ? *reinterpret_cast<const float2*>(A + 8 * h * ad.lda + 8 * j) : float2{0.0f, 0.0f};
        a[j][2 * h] = x.x, a[j][2 * h + 1] = x.y;
      }
#pragma unroll
    for (int q = 0; q < Tl::MW; ++q)
#pragma unroll
      for (int nt = 0; nt < Tl::NU; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 x = ad.local ? *reinterpret_cast<const float2*>(B + (Tl::mu(q) + 8 * h) * V + 8 * nt) : float2{0.0f, 0.0f};
          b[q][nt][2 * h] = x.x, b[q][nt][2 * h + 1] = x.y;
        }
  }
};

}  // namespace kcp::cuda::dhu
