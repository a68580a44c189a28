// Stage "state recurrence + output" for gdn with 16-bit q, k, v and the WY products folded in
// (ALGORITHMS.md 4.3: u - w S = P (beta (v - Gamma k S))). Per chunk c of L rows, S entering it:
//   X_s  = k_s @ S                                  [64,BV]  (raw k, exact 16-bit operands)
//   Y_s  = beta_s (v_s - 2^(b_s) rk_s X_s)          rows >= L are 0 (beta = 0 there)
//   vnew = P_c @ Y                                  = u - w S of the unfolded pipeline
//   o_r  = scale 2^(b_r) rq_r (q_r @ S) + sum_{s<=r} Aqk[r,s] vnew_s
//   S    = 2^(b_{L-1}) S + k_c^T @ (vnew_s 2^(b_{L-1} - b_s) rk_s)
// One block per (sequence n, value head hv, NW x BV state columns): NW warpgroups (1, or 2 at BV = 32;
// fold_layout.h picks), each owning BV = 16 or 32 columns with its own operand tiles, all sharing the
// chunk's loaded tiles (waited for at the block's barrier; each warpgroup's later barriers are its own).
// With one warpgroup of columns a loader warpgroup copies the tiles (the chain's step then issues no
// copies: 1.57 -> 1.37 us a step at K = 128, BV = 16); with two, every thread copies after the step's
// first products. The output's product is issued after the update's and waited for after S is staged
// for the next chunk, off the chain. Every product is a wgmma (wgmma.cuh) with its operands in shared
// memory as core matrices:
//   k @ S, q @ S      A = k, q tiles (K-major), B = S split into 16-bit hi + lo parts (N-major)
//   P @ Y, Aqk @ vnew TF32: A = P, Aqk tiles, B = Y, vnew (K-major, TF32-rounded)
//   k^T @ Vt          A = the same k tile read M-major, B = Vt = vnew E split into hi + lo
// The hi and lo parts of a B operand sit side by side along N: one wgmma of N = 2 BV gives A (hi) and
// A (lo) in separate accumulator columns, summed in float32 after the wait; A's tile is read once.
// The state S [K,BV] stays float32 in the accumulators; its 16-bit hi + lo split carries about 16
// significant bits into the products (TF32 would carry 11). Rows of S past K (K = 32: one m64 tile
// covers 64 rows) are computed from neighbouring data and never stored.
// Tiles of chunk c+1 (k, q, v columns, lower 8x8 blocks of P and Aqk, gates) load by cp.async while
// chunk c computes (chunk_state_fold_tiles.cuh); rows >= L of k, q, v are zero-filled; the upper blocks
// of the P and Aqk tiles are zeroed once and never written.
// The same kernel gives gdn's CP transition with 16-bit inputs (kInitTransition, no output): S_ext in
// the first V state columns (from 0, with v) and M in the next K (from I, v = 0), one launch.
// Covered by tests/cuda/test_cuda_stages.cpp ("state", every layout), test_cuda_forward.cpp,
// test_cuda_transition.cpp, test_cuda_keep.cpp and test_cuda_backward.cpp (the automatic layout; 2 x 2
// where set_multiprocessors(1) makes it the widest and V, or V + K, is a multiple of 64).
#include "cuda/chunk_state_fold.cuh"

#include <type_traits>

#include "cuda/chunk_state_fold_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {

using namespace fold;

// Per-row factors of this thread's two accumulator rows r = acc_row(0), acc_row(2).
struct RowFactors {
  float beta[2], fb[2], e[2], f[2];  // fb = beta 2^b rk, e = 2^(b_end - b) rk (0 past L), f = scale 2^b rq
};
template <class Sm>
__device__ RowFactors row_factors(const ChunkParams& p, int L, int st, const Sm& s) {
  RowFactors rf;
  const float b_end = s.gate(st, 0)[L - 1];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wg::acc_row(2 * hh);
    const float b = s.gate(st, 0)[r], gam = exp2f(b);
    const float rk = p.l2norm ? s.gate(st, 2)[r] : 1.0f, rq = p.l2norm ? s.gate(st, 3)[r] : 1.0f;
    rf.beta[hh] = s.gate(st, 1)[r];
    rf.fb[hh] = rf.beta[hh] * gam * rk;
    rf.e[hh] = r < L ? exp2f(b_end - b) * rk : 0.0f;
    rf.f[hh] = p.scale * gam * rq;
  }
  return rf;
}

// Accumulator pairs (x, x+1) as 16-bit hi + lo parts into an N-major blocked tile of 2 BV columns
// (hi in columns < BV, lo in the next BV): entry x of m64 tile mh sits at op16 + ((8 mh + h) CG + j) 128
// (CG = 2 BV / 8; row 64 mh + acc_row(x), columns acc_col(x), acc_col(x)+1), its lo part BV / 8 groups on.
template <class Tin, int BV, int NA>
__device__ __forceinline__ void store_split(char* tile, int op16, int mh, const float (&d)[NA], float f0, float f1) {
#pragma unroll
  for (int x = 0; x < NA; x += 2) {
    const int h = (x >> 1) & 1, j = x >> 2, off = op16 + (8 * mh + h) * kHiLoGroup<BV> + j * 128;
    uint32_t a, b;
    wg::split_pair<Tin>(d[x] * (h ? f1 : f0), d[x + 1] * (h ? f1 : f0), a, b);
    *reinterpret_cast<uint32_t*>(tile + off) = a;
    *reinterpret_cast<uint32_t*>(tile + off + kLoPart<BV>) = b;
  }
}

// The product of a hi + lo operand pair: accumulator columns < BV (hi) plus the next BV (lo).
template <int BV>
__device__ __forceinline__ void sum_parts(const float (&d2)[BV], float (&d)[BV / 2]) {
#pragma unroll
  for (int x = 0; x < BV / 2; ++x) d[x] = d2[x] + d2[x + BV / 2];
}

// TF32-rounded accumulator values into a K-major blocked float tile (rows = v, columns = chunk rows):
// entry x at op32 + (16 j + 2 h) 128 + 16 e.
template <int NA>
__device__ __forceinline__ void store_tf32_t(char* dst, int op32, const float (&d)[NA]) {
#pragma unroll
  for (int x = 0; x < NA; ++x)
    *reinterpret_cast<float*>(dst + op32 + (16 * (x >> 2) + 2 * ((x >> 1) & 1)) * 128 + 16 * (x & 1)) = tf32_round(d[x]);
}

// Shared-memory descriptors of every operand tile (stage 0 for the loaded tiles; stage 1 is
// + bytes_stage / 16, wg::adv).
struct FoldDescs {
  uint64_t k, q, km, p, a, sb, y, n, vt;
};
template <class Tin, int KD, int BV, int NW>
__device__ FoldDescs make_descs(const FoldSmem<Tin, KD, BV, NW>& s) {
  constexpr uint32_t kB = kHiLoGroup<BV>;
  FoldDescs d;
  d.k = wg::desc(s.Ks(0), 16, 1024, true), d.q = wg::desc(s.Qs(0), 16, 1024, true);  // K-major A, swizzled
  d.km = wg::desc(s.Ks(0), kChunk * 128, 1024, true);  // M-major A: the k tile read as k^T (regions of 64 i)
  d.p = wg::desc(s.Ps(0), 16, 1024, true), d.a = wg::desc(s.As(0), 16, 1024, true);
  d.sb = wg::desc(s.Sb(), kB, 128);  // N-major B, interleaved
  d.y = wg::desc(s.Yb(), 128, 16 * 128), d.n = wg::desc(s.Nb(), 128, 16 * 128);
  d.vt = wg::desc(s.Vt(), kB, 128);
  return d;
}
using wg::adv;
// Start of K step ks in a swizzled K-major tile of 64 rows (k, q, P, Aqk).
constexpr uint32_t kStepK(int ks) { return wg::sw128_k_step(ks, kChunk); }

// X2 = k @ [S hi, S lo] and QX2 = q @ [S hi, S lo] (two commit groups: X2 first; sum_parts after the
// wait). `so`: stage offset / 16.
template <class Tin, int KD, int BV>
__device__ void issue_state_products(const FoldDescs& d, uint64_t so, float (&X2)[BV], float (&QX2)[BV]) {
  constexpr uint32_t kB = kHiLoGroup<BV>;
  wg::pin(X2), wg::pin(QX2);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk)  // A = k (K-major), B = S hi, lo (N-major)
    wg::mma16<Tin, 2 * BV, 0, 1>(X2, adv(d.k + so, kStepK(kk)), adv(d.sb, 2 * kk * kB), kk > 0);
  wg::commit();
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk)
    wg::mma16<Tin, 2 * BV, 0, 1>(QX2, adv(d.q + so, kStepK(kk)), adv(d.sb, 2 * kk * kB), kk > 0);
  wg::commit();
}

// D (+)= T @ B over the 64 chunk rows: T a blocked float tile (P or Aqk), B a blocked [BV][64] tile.
template <int BV>
__device__ __forceinline__ void tf32_chunk_product(float (&d)[BV / 2], uint64_t dt, uint64_t db, bool accumulate) {
#pragma unroll
  for (int ks = 0; ks < kChunk / 8; ++ks) wg::mma_tf32<BV>(d, adv(dt, kStepK(ks)), adv(db, 256 * ks), accumulate || ks > 0);
}

// U2 = k^T @ [Vt hi, Vt lo] (A = the k tile read M-major, one m64 tile per 64 key rows).
template <class Tin, int KD, int BV>
__device__ void issue_update(const FoldDescs& d, uint64_t so, float (&U2)[KD >= 64 ? KD / 64 : 1][BV]) {
  constexpr uint32_t kB = kHiLoGroup<BV>;
#pragma unroll
  for (int mh = 0; mh < (KD >= 64 ? KD / 64 : 1); ++mh)
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks)
      wg::mma16<Tin, 2 * BV, 1, 1>(U2[mh], adv(d.km + so, 2 * ks * 1024 + mh * kChunk * 128), adv(d.vt, 2 * ks * kB), ks > 0);
}

// o rows < L in the dtype of the o view: column pairs stored together where the view is aligned for
// them, else one element each (tile_store.cuh store_acc_rows<2>). The warp's 16 rows: its index within
// the warpgroup (with one, threadIdx.x >> 5: the `& 3` took 4 more registers in those kernels).
template <int NW, int NA>
__device__ void store_output(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, const float (&o)[NA]) {
  const int warp = NW == 1 ? int(threadIdx.x >> 5) : int(threadIdx.x >> 5) & 3;
  store_acc_rows<2>(sp.o.p, sp.o.dt, int64_t(ck.t0) * sp.o.st + int64_t(hv) * sp.o.sx + v0, sp.o.st, ck.len, 16 * warp,
                    reinterpret_cast<const float(&)[NA / 4][4]>(o));
}

// The kept forward's h[c] (the state entering chunk c) and vnew (rows < L), accumulator pairs (x, x+1:
// adjacent columns) stored together: whole 32-byte sectors and half the store instructions of one
// element each (those cost the kept forward ~0.4 ms at gdn T = 32768, H = 16, inside the chain's step).
template <int KD, int NA>
__device__ void write_h(const StateParams& sp, int c, int hv, int v0, const float (&S)[KD >= 64 ? KD / 64 : 1][NA]) {
#pragma unroll
  for (int mh = 0; mh < (KD >= 64 ? KD / 64 : 1); ++mh)
#pragma unroll
    for (int x = 0; x < NA; x += 2) {
      const int i = 64 * mh + wg::acc_row(x);
      if (i < KD)
        *reinterpret_cast<float2*>(sp.h + ((int64_t(c) * sp.c.HV + hv) * KD + i) * sp.Vw + v0 + wg::acc_col(x)) =
            make_float2(S[mh][x], S[mh][x + 1]);
    }
}
template <int NA>
__device__ void write_vnew(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, const float (&VN)[NA]) {
#pragma unroll
  for (int x = 0; x < NA; x += 2) {
    const int r = wg::acc_row(x);
    if (r < ck.len)
      *reinterpret_cast<float2*>(sp.vnew + (int64_t(ck.t0 + r) * sp.c.HV + hv) * sp.Vw + v0 + wg::acc_col(x)) =
          make_float2(VN[x], VN[x + 1]);
  }
}

// Y = beta v - fb X for this thread's accumulator entries (v from its row-major tile), into the TF32
// operand tile of P @ Y.
template <class Tin, int KD, int BV, int NW>
__device__ void form_y(const FoldSmem<Tin, KD, BV, NW>& s, int st, const OperandPlan<BV>& op, const RowFactors& rf,
                       const float (&X)[BV / 2]) {
  float y[BV / 2];
  const char* vs = s.Vs(st) + 2 * (wg::acc_row(0) * BV + wg::acc_col(0));
#pragma unroll
  for (int x = 0; x < BV / 2; x += 2) {
    const int hh = (x >> 1) & 1;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(vs + 2 * (8 * hh * BV + 8 * (x >> 2)));
    y[x] = rf.beta[hh] * __uint_as_float(widen_lo<Tin>(w)) - rf.fb[hh] * X[x];
    y[x + 1] = rf.beta[hh] * __uint_as_float(widen_hi<Tin>(w)) - rf.fb[hh] * X[x + 1];
  }
  store_tf32_t(s.Yb(), op.op32, y);
}

// S entering the sequence: h0 where given (rows i < K), the identity in the transition's M columns
// (kInitTransition: the columns from Vu), else zero.
template <int KD, int NA>
__device__ __forceinline__ void load_initial_state(const StateParams& sp, int n, int hv, int v0,
                                                   float (&S)[KD >= 64 ? KD / 64 : 1][NA]) {
  const StateView& h0 = sp.h0;
#pragma unroll
  for (int mh = 0; mh < (KD >= 64 ? KD / 64 : 1); ++mh)
#pragma unroll
    for (int x = 0; x < NA; ++x) {
      const int i = 64 * mh + wg::acc_row(x), v = v0 + wg::acc_col(x);
      float x0 = 0.0f;
      if (sp.init == kInitGiven && i < KD) x0 = load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + i * h0.si + v * h0.sj);
      else if (sp.init == kInitTransition) x0 = i == v - sp.Vu ? 1.0f : 0.0f;
      S[mh][x] = x0;
    }
}

template <int KD, int NA>
__device__ __forceinline__ void store_final_state(const StateParams& sp, int n, int hv, int v0,
                                                  const float (&S)[KD >= 64 ? KD / 64 : 1][NA]) {
  const StateView& f = sp.final_state;
  if (!f.p) return;
#pragma unroll
  for (int mh = 0; mh < (KD >= 64 ? KD / 64 : 1); ++mh)
#pragma unroll
    for (int x = 0; x < NA; ++x) {
      const int i = 64 * mh + wg::acc_row(x), v = v0 + wg::acc_col(x);
      if (i < KD) store_any(f.p, f.dt, n * f.sn + hv * f.shv + i * f.si + v * f.sj, S[mh][x]);
    }
}

// The state entering a chunk as the hi + lo operand tiles of k @ S and q @ S (rows past K: K = 32 only,
// never read). The warpgroup's products that read the tiles are done (its barrier before the update);
// the next chunk's barrier publishes them to wgmma and to every thread.
template <class Tin, int KD, int BV, int NW>
__device__ __forceinline__ void stage_state(const FoldSmem<Tin, KD, BV, NW>& s, const OperandPlan<BV>& op,
                                            const float (&S)[KD >= 64 ? KD / 64 : 1][BV / 2]) {
#pragma unroll
  for (int mh = 0; mh < (KD >= 64 ? KD / 64 : 1); ++mh)
    if (KD >= 64 || wg::acc_row(0) < KD) store_split<Tin, BV>(s.Sb(), op.op16, mh, S[mh], 1.0f, 1.0f);
}

// vnew = P @ (beta v - fb X) once X = k @ S has landed; leaves the operand tiles of the update
// (Vt = vnew E) and of the output (TF32 vnew). QX = q @ S lands here too.
template <class Tin, int KD, int BV, int NW>
__device__ __forceinline__ void compute_vnew(const StateParams& sp, const FoldSmem<Tin, KD, BV, NW>& s, int st, uint64_t so,
                                             const OperandPlan<BV>& op, const FoldDescs& dsc,
                                             const RowFactors& rf, const ChunkInfo& ck, int hv, int v0,
                                             float (&X2)[BV], float (&QX2)[BV], float (&QX)[BV / 2],
                                             float (&VN)[BV / 2]) {
  wg::wait<1>();  // X2
  wg::pin(X2);
  float X[BV / 2];
  sum_parts<BV>(X2, X);
  form_y(s, st, op, rf, X);
  wg::fence_proxy_async();
  wg::sync_warpgroup();  // Y is this warpgroup's own
  wg::pin(VN);
  wg::fence();
  tf32_chunk_product<BV>(VN, dsc.p + so, dsc.y, false);
  wg::commit();
  wg::wait<0>();  // VN and QX2
  wg::pin(VN), wg::pin(QX2);
  sum_parts<BV>(QX2, QX);
  store_split<Tin, BV>(s.Vt(), op.op16, 0, VN, rf.e[0], rf.e[1]);  // Vt = vnew E for the update
  store_tf32_t(s.Nb(), op.op32, VN);                                // vnew for the output
  if (sp.vnew) write_vnew(sp, ck, hv, v0, VN);
}

// S = 2^(b_end) S + k^T @ Vt (the product on wgmma, summed into S after its wait) and o = f QX + Aqk @
// vnew (wgmma, a commit group after the update's), then o to memory. The output's product is not on the
// chain: it runs while S is summed and staged for the next chunk, c_next (-1: none; h[c_next] is the kept
// forward's), the next step's first work.
template <class Tin, int KD, int BV, int NW>
__device__ __forceinline__ void update_and_output(const StateParams& sp, const FoldSmem<Tin, KD, BV, NW>& s, int st,
                                                  uint64_t so, const OperandPlan<BV>& op, const FoldDescs& dsc,
                                                  const RowFactors& rf, const ChunkInfo& ck, int c_next, int hv, int v0,
                                                  float (&QX)[BV / 2], float (&S)[KD >= 64 ? KD / 64 : 1][BV / 2]) {
  constexpr int MH = KD >= 64 ? KD / 64 : 1;
  const float decay = exp2f(s.gate(st, 0)[ck.len - 1]);
#pragma unroll
  for (int x = 0; x < BV / 2; ++x) QX[x] *= rf.f[(x >> 1) & 1];
  wg::fence_proxy_async();
  wg::sync_warpgroup();  // Vt and vnew are this warpgroup's own
  float U2[MH][BV];
  wg::pin(QX);
#pragma unroll
  for (int mh = 0; mh < MH; ++mh) wg::pin(U2[mh]);
  wg::fence();
  issue_update<Tin, KD, BV>(dsc, so, U2);
  wg::commit();
  tf32_chunk_product<BV>(QX, dsc.a + so, dsc.n, true);
  wg::commit();
#pragma unroll
  for (int x = 0; x < BV / 2; ++x)  // beside the products
#pragma unroll
    for (int mh = 0; mh < MH; ++mh) S[mh][x] *= decay;
  wg::wait<1>();  // the update
#pragma unroll
  for (int mh = 0; mh < MH; ++mh) {
    wg::pin(U2[mh]);
#pragma unroll
    for (int x = 0; x < BV / 2; ++x) S[mh][x] += U2[mh][x] + U2[mh][x + BV / 2];
  }
  stage_state(s, op, S);  // (after the last chunk, never read: no branch between the output's issue and wait)
  wg::wait<0>();  // the output
  wg::pin(QX);
  if (sp.h && c_next >= 0) write_h<KD, BV / 2>(sp, c_next, hv, v0, S);
  if (sp.o.p) store_output<NW>(sp, ck, hv, v0, QX);
}

// The loader warpgroup (kLoaderWarpgroup): chunk c+1's tiles into the other stage while the chain's
// warpgroup computes chunk c. Its barrier of each step (with the chain's at the top of its step) says
// chunk c's tiles have landed and chunk c-1's stage is free.
template <class Tin, int KD, int BV, int NW>
__device__ void load_chunks(const StateParams& sp, const FoldSmem<Tin, KD, BV, NW>& s, const ChainBlock& b) {
  const ChunkParams& p = sp.c;
  const ThreadPlan<Tin, KD, BV, NW> tp(int(threadIdx.x) - NW * kWarpgroup);
  ChunkInfo next = b.c_begin < b.c_end ? p.chunks[b.c_begin] : ChunkInfo{};
  if (b.c_begin < b.c_end) issue_loads(sp, tp, next, b.c_begin, b.hv, b.v0, s.stage(0));
  cp_async_commit();
  if (b.c_begin + 1 < b.c_end) next = p.chunks[b.c_begin + 1];
  for (int c = b.c_begin; c < b.c_end; ++c) {
    const int st = (c - b.c_begin) & 1;
    const ChunkInfo after = c + 2 < b.c_end ? p.chunks[c + 2] : next;
    cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();  // chunk c's tiles visible to wgmma and every thread; chunk c-1 done by all
    if (c + 1 < b.c_end) issue_loads(sp, tp, next, c + 1, b.hv, b.v0, s.stage(st ^ 1));
    cp_async_commit();
    next = after;
  }
}

template <class Tin, int KD, int BV, int NW>
__global__ void __launch_bounds__(kBlockThreads<NW>, 1) chunk_state_fold_kernel(const StateParams sp) {
  using Sm = FoldSmem<Tin, KD, BV, NW>;
  constexpr int NA = BV / 2, MH = KD >= 64 ? KD / 64 : 1;
  constexpr uint64_t kStageDesc = Sm::bytes_stage >> 4;
  constexpr bool kLoader = kLoaderWarpgroup<NW>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const ChainBlock b = chain_block(p, NW * BV);
  expect_swizzle_aligned(smem_f4);
  for (int i = threadIdx.x; i < int(2 * Sm::bytes_stage / 16); i += kBlockThreads<NW>)  // never-copied parts stay 0
    smem_f4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // (P, Aqk upper blocks; K = 32 pad)
  __syncthreads();  // the zeros land before any copy into the same tiles
  if (kLoader && threadIdx.x >= NW * kWarpgroup) return load_chunks(sp, s, b);
  const int v0 = b.v0 + BV * warpgroup<NW>(), n = b.n, hv = b.hv, c_begin = b.c_begin, c_end = b.c_end;
  const OperandPlan<BV> op;
  const ThreadPlan<Tin, KD, BV, NW> tp(threadIdx.x);  // (the chain's own copies: without a loader)
  const FoldDescs dsc = make_descs(s);
  float S[MH][NA];  // S(i = 64 mh + acc_row(x), v0 + acc_col(x)); rows i >= K unused
  load_initial_state<KD, NA>(sp, n, hv, v0, S);
  ChunkInfo ck = c_begin < c_end ? p.chunks[c_begin] : ChunkInfo{};
  ChunkInfo next = c_begin + 1 < c_end ? p.chunks[c_begin + 1] : ck;  // the chunk table runs two ahead
  if (!kLoader) {
    if (c_begin < c_end) issue_loads(sp, tp, ck, c_begin, hv, v0, s.stage(0));
    cp_async_commit();
  }
  stage_state(s, op, S);
  if (sp.h && c_begin < c_end) write_h<KD, NA>(sp, c_begin, hv, v0, S);
  for (int c = c_begin; c < c_end; ++c) {
    // The stage from lane 0: ptxas then keeps the stage's descriptors in uniform registers (from c,
    // loaded from the chunk table, it kept them in ordinary ones, two R2UR before every wgmma).
    const int st = __shfl_sync(0xffffffffu, (c - c_begin) & 1, 0);
    const uint64_t so = st ? kStageDesc : 0;
    const ChunkInfo after = c + 2 < c_end ? p.chunks[c + 2] : next;
    if (!kLoader) cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();  // chunk c's tiles and the S operands visible to wgmma; chunk c-1 done by all
    float X2[BV], QX2[BV], QX[NA], VN[NA];
    issue_state_products<Tin, KD, BV>(dsc, so, X2, QX2);
    if (!kLoader) {
      if (c + 1 < c_end) issue_loads(sp, tp, next, c + 1, hv, v0, s.stage(st ^ 1));
      cp_async_commit();
    }
    const RowFactors rf = row_factors(p, ck.len, st, s);
    compute_vnew(sp, s, st, so, op, dsc, rf, ck, hv, v0, X2, QX2, QX, VN);
    update_and_output(sp, s, st, so, op, dsc, rf, ck, c + 1 < c_end ? c + 1 : -1, hv, v0, QX, S);
    ck = next, next = after;
  }
  store_final_state<KD, NA>(sp, n, hv, v0, S);
}

// A block: NW warpgroups of BV columns each (the loaded tiles shared, one block a multiprocessor).
template <class Tin, int KD, int BV, int NW>
void launch(const StateParams& sp, cudaStream_t stream) {
  using Sm = FoldSmem<Tin, KD, BV, NW>;
  static_assert(Sm::bytes <= 227 * 1024, "folded state tiles exceed shared memory");
  launch_kernel(chunk_state_fold_kernel<Tin, KD, BV, NW>, dim3(sp.Vw / (NW * BV), sp.c.N * sp.c.HV), kBlockThreads<NW>,
                Sm::bytes, stream, sp);
}

}  // namespace

FoldLayout launch_chunk_state_fold(const StateParams& sp, int input_dtype, FoldLayout layout, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  // The forward (V columns from v, init 0 or given) or the CP transition (kInitTransition: S_ext in
  // the V columns, M = the same chain on I with v = 0 in the next K; no o, h, vnew).
  const bool forward = sp.Vw == p.V && sp.u == p.u && (sp.init == kInitZero || sp.init == kInitGiven);
  const bool transition = sp.init == kInitTransition && sp.Vu == p.V && sp.Vw == p.V + p.K && !sp.o.p && !sp.h && !sp.vnew;
  KCP_CHECK(state_fold_applies(p, input_dtype) && (forward || transition) && p.V % 32 == 0 && sp.Vw % 32 == 0,
            "cuda-chunkwise: the folded state kernel serves the gdn forward and transition with 16-bit inputs only");
  KCP_CHECK(fold_layout_valid(layout), "launch_chunk_state_fold: no kernel for ", layout.groups, " column groups x ",
            layout.warpgroups, " warpgroups");
  const FoldLayout f = resolve_fold_layout(layout, sp.Vw, int64_t(p.N) * p.HV, multiprocessors(p));
  if (p.N * p.HV == 0) return f;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    if constexpr (sizeof(Tin) == 2)
      dispatch_key_dim(p.K, [&](auto kd) {
        constexpr int KD = decltype(kd)::value;
        if (f.warpgroups == 2) launch<Tin, KD, 32, 2>(sp, stream);
        else if (f.groups == 1) launch<Tin, KD, 16, 1>(sp, stream);
        else launch<Tin, KD, 32, 1>(sp, stream);
      });
  });
  return f;
}

}  // namespace kcp::cuda
