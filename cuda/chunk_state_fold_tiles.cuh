// Shared-memory plan of the folded state kernel (chunk_state_fold.cu) and its cp.async loads.
//   A block is NW warpgroups, warpgroup w owning the BV state columns [v0 + w BV, + BV): the loaded
//   tiles of a chunk are shared by all of them, the thread-written operands are each warpgroup's own.
//   Per stage (two, chunk c+1 loads while chunk c computes), 128-byte-swizzled (wg::sw128_offset):
//   k, q [64][max(K,64)] 16-bit; P, Aqk [64][64] float32 (only the 8x8 blocks on and below the
//   diagonal are copied; the rest is zeroed once); NW tiles v [64][BV] row-major; gates b, beta,
//   rstd_k, rstd_q [4][64]. Written by each warpgroup each chunk, interleaved core matrices
//   (wg::blocked_offset): S [K][2 BV] and Vt [64][2 BV] (16-bit, N-major: the hi parts in columns < BV,
//   the lo parts in the next BV, so that one wgmma of N = 2 BV reads its A tile once for both), Y and
//   vnew [BV][64] (TF32, K-major).
// OperandPlan, ThreadPlan: the per-thread constants of the operand stores and the copies, computed
// once; 8 consecutive copy threads copy one 128-byte global line into one swizzled row (whole sectors,
// no bank conflicts), so every address in the chunk loop is a base plus a compile-time offset. One
// warpgroup of state columns has a loader warpgroup that copies k, q, P, Aqk, v and the gates (the
// block's threads 128-255); with two, k, q, P, Aqk are copied by all threads, each warpgroup's v
// columns by that warpgroup.
// Covered by tests/cuda/test_cuda_stages.cpp ("state", every layout) and test_cuda_forward.cpp.
#pragma once

#include "cuda/chunk_params.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/wgmma.cuh"

namespace kcp::cuda::fold {

constexpr int kWarpgroup = 128;
// This thread's warpgroup within a block of NW (its state columns, v tile and operand tiles); with one,
// the constant 0, so that the one-warpgroup kernels keep the code they had before there were more.
// Broadcast from lane 0 (call with the warp converged): ptxas then knows the value is the same across
// the warp and keeps the operand tiles' wgmma descriptors in uniform registers (threadIdx / 128 put
// them in ordinary ones, moved by R2UR before every wgmma).
template <int NW>
__device__ __forceinline__ int warpgroup() {
  return NW == 1 ? 0 : __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroup, 0);
}
constexpr int kTileT = 4 * kChunk * kChunk;  // bytes of a 64x64 float tile (P, Aqk)
// The hi + lo operand tiles (S, Vt: N-major blocked, 2 BV 16-bit columns, hi in columns < BV): bytes of
// one 8-row group (the descriptors' LBO), and the lo part's offset within a group.
template <int BV>
constexpr uint32_t kHiLoGroup = (BV / 4) * 128;
template <int BV>
constexpr uint32_t kLoPart = (BV / 8) * 128;

template <class Tin, int KD, int BV, int NW>
struct FoldSmem {
  static constexpr int KP = KD < 64 ? 64 : KD;  // k, q tiles at least one 128-byte region wide
  static constexpr size_t bytes_k = 2 * kChunk * KP, bytes_v = 2 * kChunk * BV, bytes_g = 4 * 4 * kChunk;
  static constexpr size_t bytes_stage = 2 * bytes_k + 2 * kTileT + NW * bytes_v + bytes_g;  // a multiple of 1024
  static constexpr size_t bytes_s = 2 * KD * BV, bytes_t = 4 * kChunk * BV, bytes_vt = 2 * kChunk * BV;
  static constexpr size_t bytes_ops = 2 * bytes_s + 2 * bytes_t + 2 * bytes_vt;  // one warpgroup's
  static constexpr size_t bytes = 2 * bytes_stage + NW * bytes_ops;
  static_assert(bytes_stage % 1024 == 0, "swizzled tiles need 1024-byte aligned stages");
  char* base;
  int w;  // this thread's warpgroup: its v tile and operand tiles
  __device__ explicit FoldSmem(char* b) : base(b), w(warpgroup<NW>()) {}
  __device__ char* stage(int st) const { return base + st * bytes_stage; }
  __device__ char* Ks(int st) const { return stage(st); }                       // 128B-swizzled [64][KP]
  __device__ char* Qs(int st) const { return stage(st) + bytes_k; }             // 128B-swizzled [64][KP]
  __device__ char* Ps(int st) const { return stage(st) + 2 * bytes_k; }         // 128B-swizzled [64][64] f32
  __device__ char* As(int st) const { return Ps(st) + kTileT; }                 // 128B-swizzled [64][64] f32
  __device__ char* Vs(int st) const { return As(st) + kTileT + (NW == 1 ? 0 : w * bytes_v); }  // row-major [64][BV]
  // gates of the chunk: 0 b (log2 cumsum), 1 beta, 2 rstd_k, 3 rstd_q
  __device__ const float* gate(int st, int a) const {
    return reinterpret_cast<const float*>(As(st) + kTileT + NW * bytes_v) + a * kChunk;
  }
  __device__ char* ops() const { return base + 2 * bytes_stage + (NW == 1 ? 0 : w * bytes_ops); }
  __device__ char* Sb() const { return ops(); }                                   // blocked [K][2 BV]: hi, lo
  __device__ char* Yb() const { return ops() + 2 * bytes_s; }                     // blocked [BV][64] f32
  __device__ char* Nb() const { return Yb() + bytes_t; }                          // blocked [BV][64] f32
  __device__ char* Vt() const { return Nb() + bytes_t; }                          // blocked [64][2 BV]: hi, lo
};

// Where this consumer thread's operand stores go (computed once): the blocked offsets of its accumulator
// entry 0 in its warpgroup's 16-bit N-major (hi part) and float K-major operand tiles.
template <int BV>
struct OperandPlan {
  int op16, op32;
  __device__ OperandPlan() {
    const int w = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    op16 = 2 * w * kHiLoGroup<BV> + g * 16 + 4 * t;  // rows of 2 BV columns
    op32 = (4 * w + g / 4) * 128 + 2 * t * 16 + (g % 4) * 4;
  }
};

// Which threads copy a chunk's tiles: with one warpgroup of state columns, a loader warpgroup of its own
// (threads 128-255), so that the chain's step issues no copies (with them, ~240 of its ~840 warp
// instructions and ~28% of its stall samples went to the copies and their addresses, after the
// products they were to overlap had finished: ncu, K = 128, fifty-first session); with two (2 x 2), the
// chain's own threads, right after the step's first products (a third warpgroup would leave 168 registers
// a thread where that kernel takes 178).
template <int NW>
constexpr bool kLoaderWarpgroup = NW == 1;
template <int NW>
constexpr int kCopyThreads = kLoaderWarpgroup<NW> ? kWarpgroup : NW * kWarpgroup;
template <int NW>
constexpr int kBlockThreads = NW * kWarpgroup + (kLoaderWarpgroup<NW> ? kWarpgroup : 0);

// Per-thread constants of the copies (computed once) for copy thread `tid` of kCopyThreads<NW>: 8
// consecutive threads copy one 128-byte global line into one swizzled 128-byte row (whole sectors, no
// bank conflicts); copy i lands at dst + i * step.
template <class Tin, int KD, int BV, int NW>
struct ThreadPlan {
  static constexpr int kThreads = kCopyThreads<NW>;
  static constexpr int kCpr = KD / 8, kRowStep = kThreads / kCpr;  // k, q: 16-byte chunks per row
  static constexpr int kRowCopies = (kChunk + kRowStep - 1) / kRowStep;  // the last may pass row 63 (skipped)
  static constexpr int vCpr = BV / 8, vRowStep = kWarpgroup / vCpr;     // v: by 128 threads a warpgroup
  static_assert(8 % NW == 0, "P, Aqk: the 8 row blocks shared evenly by the warpgroups");
  int tid;
  int kq_row, kq_col, kq_dst;  // row of copy 0, element column, smem offset (copy i: + kRowStep * 128 i)
  int v_row, v_col, v_dst;     // row and column of copy 0, smem offset in the stage (copy i: + 2048 i)
  int t_blk, t_src, t_ch, t_dst;  // P, Aqk: 8-row block of copy 0 (copy i: + NW i), float offset, chunk, smem
  __device__ explicit ThreadPlan(int t) : tid(t) {
    const int wgi = NW == 1 ? 0 : tid / kWarpgroup, lt = NW == 1 ? tid : tid % kWarpgroup;
    kq_row = tid / kCpr, kq_col = 8 * (tid % kCpr);
    kq_dst = wg::sw128_offset<Tin>(NW == 1 ? kq_row : kq_row % kChunk, kq_col, kChunk);
    v_row = lt / vCpr, v_col = 8 * (lt % vCpr);
    v_dst = 2 * kChunk * BV * wgi + 16 * lt;
    // rows 8 t_blk + (lt >> 4) of P and Aqk, 16-byte chunk t_ch of the row
    t_blk = wgi, t_ch = lt & 15;
    const int row = 8 * t_blk + (lt >> 4);
    t_src = row * kChunk + 4 * t_ch, t_dst = wg::sw128_offset<float>(row, 4 * t_ch, kChunk);
  }
};

// Chunk `ck`'s tiles into `stage`: k, q, the v columns [v0, v0+BV) of this thread's warpgroup (rows >=
// L zero-filled), the 8x8 blocks of P and Aqk on and below the diagonal, and the gates. Full chunks
// (all but the last of a sequence) take the copies without row predicates.
template <bool kFull, class Tin, int KD, int BV, int NW>
__device__ __forceinline__ void copy_rows(const StateParams& sp, const ThreadPlan<Tin, KD, BV, NW>& tp, const ChunkInfo& ck,
                                          int hv, int v0, char* stage) {
  using Sm = FoldSmem<Tin, KD, BV, NW>;
  using Tp = ThreadPlan<Tin, KD, BV, NW>;
  const ChunkParams& p = sp.c;
  const int h = hv / p.G, L = ck.len;
  const Tin* k0 = static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0, h);  // row 0: valid for any L
  const Tin* q0 = static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0, h);
  const Tin* k = k0 + tp.kq_row * p.k.st + tp.kq_col;
  const Tin* q = q0 + tp.kq_row * p.q.st + tp.kq_col;
#pragma unroll
  for (int i = 0; i < Tp::kRowCopies; ++i) {
    const int row = tp.kq_row + Tp::kRowStep * i;
    if (Tp::kRowStep * Tp::kRowCopies > kChunk && row >= kChunk) continue;  // K = 32 with several warpgroups
    const bool valid = kFull || row < L;
    const int64_t dk = Tp::kRowStep * i * p.k.st, dq = Tp::kRowStep * i * p.q.st;
    cp_async16(stage + tp.kq_dst + Tp::kRowStep * 128 * i, valid ? k + dk : k0, valid);
    cp_async16(stage + Sm::bytes_k + tp.kq_dst + Tp::kRowStep * 128 * i, valid ? q + dq : q0, valid);
  }
  // v's columns; none past u_width (the transition's M columns: v = 0, zero-filled from a valid address)
  const bool has_v = v0 < u_width(sp);
  const Tin* v0p = static_cast<const Tin*>(p.v.p) + row_off(p.v, ck.t0, hv) + (has_v ? v0 : 0);
  const Tin* v = v0p + tp.v_row * p.v.st + tp.v_col;
#pragma unroll
  for (int i = 0; i < kChunk / Tp::vRowStep; ++i) {
    const bool valid = has_v && (kFull || tp.v_row + Tp::vRowStep * i < L);
    cp_async16(stage + 2 * Sm::bytes_k + 2 * kTileT + tp.v_dst + 2048 * i, valid ? v + Tp::vRowStep * i * p.v.st : v0p,
               valid);
  }
}

template <class Tin, int KD, int BV, int NW>
__device__ void issue_loads(const StateParams& sp, const ThreadPlan<Tin, KD, BV, NW>& tp, const ChunkInfo& ck, int ci,
                            int hv, int v0, char* stage) {
  using Sm = FoldSmem<Tin, KD, BV, NW>;
  const ChunkParams& p = sp.c;
  const int h = hv / p.G, L = ck.len;
  with_full_chunk(L, [&](auto full) { copy_rows<decltype(full)::value>(sp, tp, ck, hv, v0, stage); });
  const float* P = p.P + (int64_t(ci) * p.HV + hv) * kChunk * kChunk + tp.t_src;
  const float* A = p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk + tp.t_src;
  char* pt = stage + 2 * Sm::bytes_k + tp.t_dst;
#pragma unroll
  for (int i = 0; i < 8 / NW; ++i)  // rows 8b..8b+7 (b = t_blk + NW i): the chunks of the 8x8 blocks 0..b
    if (tp.t_ch < 2 * ((NW == 1 ? 0 : tp.t_blk) + NW * i + 1)) {
      cp_async16(pt + 1024 * NW * i, P + 512 * NW * i, true);
      cp_async16(pt + kTileT + 1024 * NW * i, A + 512 * NW * i, true);
    }
  float* gates = reinterpret_cast<float*>(stage + 2 * Sm::bytes_k + 2 * kTileT + NW * Sm::bytes_v);
  const int r = tp.tid & 63;  // copy threads 0-63: b, beta; 64-127: rstd
  const bool valid = r < L;
  const int64_t tt = ck.t0 + (valid ? r : 0);
  if (tp.tid < 64) {
    cp_async4(gates + r, p.gcum + tt * p.HV + hv, valid);
    cp_async4(gates + kChunk + r, p.beta_e + tt * p.HV + hv, valid);
  } else if ((NW == 1 || tp.tid < kWarpgroup) && p.l2norm) {
    cp_async4(gates + 2 * kChunk + r, p.rstd_k + tt * p.H + h, valid);
    cp_async4(gates + 3 * kChunk + r, p.rstd_q + tt * p.H + h, valid);
  }
}

}  // namespace kcp::cuda::fold
