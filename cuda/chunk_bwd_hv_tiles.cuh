// Kernel hv's layout and loads (chunk_bwd_hv.cu): one block of two 256-thread halves per (chunk,
// value head) at a time (gla: one half per block, HvShape::kKeyBlocks blocks per item), the V slabs
// double-buffered in shared memory:
//   P' [64][68] | dXu [64][36] | buffer 0, 1: do, dvnew [64][36], vnew [64][32], h, dh [max(K, 64)][32] |
//   beta, gdn gates [64] | rowsum(h dh) per half [64] | reductions [16 x 64]
//   | with 16-bit inputs (kHvQkStaged): q, k, v and kda's gate rows (chunk_bwd_hv_stage.cuh)
// (delta rule). vnew, h and dh are the B operands of wgmma (the unsplit products, chunk_bwd_hv.cu):
// rows of 32 floats = 128 bytes in wgmma's 128-byte swizzle (sw_off), every region 1024-byte aligned;
// do, dvnew and dXu, read only as register A fragments or by mma.sync, keep the padded rows.
// gla: do, v [64][36], h, dh [max(K, 64)][36] per buffer, no swizzle.
// (kda's and gla's row-block key totals X1, X2 per half [4][KW] reuse buffer 0 after the slabs; raw P is staged
// in buffer 1 before slab 0; gla has no P', dXu, dvnew, and h, dh hold the block's 64 or fewer key rows).
// The slab loads: cp.async for the float32 workspaces (vnew, dvnew, h, dh),
// registers for the 16-bit or float32 inputs (do; gla's v), both issued a slab ahead.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" and end to end).
#pragma once

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"

namespace kcp::cuda::hv {

constexpr int kLdV = kLdS;  // [64][32] V slabs: A fragments (rows) and n-major B fragments, 4 mod 32 words
constexpr int kSlabFloats = kChunk * kLdV;
// v's staged slab rows (kHvQkStaged, chunk_bwd_hv_stage.cuh): 32 16-bit values + 8 = 20 words, so that a warp's pair
// loads in slab_dxu (rows g, columns 2t) fall on distinct banks
constexpr int kLdVs = kSlab + 8;

// Float offset of element (r, c), c < 32, of a slab whose 128-byte rows are in wgmma's 128-byte
// swizzle (wgmma.cuh sw128_offset for 4-byte elements): the 16-byte chunk c / 4 of row r stored at
// chunk (c / 4) ^ (r % 8). ldmatrix rows of one chunk then fall on distinct banks, as with kLdV.
__host__ __device__ constexpr int sw_off(int r, int c) { return r * kSlab + ((((c >> 2) ^ r) & 7) << 2) + (c & 3); }
// The slab offset of (r, c) in the layout kSw (swizzled) or padded rows of kLdV.
template <bool kSw>
__host__ __device__ constexpr int slab_off(int r, int c) { return kSw ? sw_off(r, c) : r * kLdV + c; }

// Whether kernel hv's products run on wgmma (the delta rule, unsplit: 16-bit inputs), else mma.sync.
template <bool kDelta, bool kSplit>
constexpr bool kHvWgmma = kDelta && !kSplit;

// Whether kernel hv stages q's, k's and v's rows in shared memory (chunk_bwd_hv_stage.cuh): the delta
// rule with 16-bit inputs (unsplit products imply q, k, v 16-bit, their rows 16-byte aligned by the
// forward's rule). Float32 inputs would need twice the bytes, which do not fit beside the rest. The
// epilogue's q and k had been loaded tile by tile, four round trips an item; v at the start of
// P^T dvnew, waited for at its end.
template <bool kDelta, bool kSplit>
constexpr bool kHvQkStaged = kDelta && !kSplit;

template <int KD, bool kDelta>
struct HvShape {
  static constexpr int KW = KD < 64 ? KD : 64;  // key rows per half
  static constexpr int NH = KD / KW;            // halves that own key rows (1 or 2)
  static constexpr int NTW = KW / 16;           // 8-column tiles of a warp (its half of KW)
  // gla shares nothing costly between its halves (no P, no dXu): with K = 128 they are two blocks of
  // an item, adjacent in the grid (do, v read twice, the second time from L2), so that two blocks
  // share a multiprocessor and one's loads overlap the other's products and epilogue
  static constexpr int kKeyBlocks = !kDelta && NH == 2 ? 2 : 1;
  static constexpr int kHalves = kDelta ? 2 : 1;  // halves per block
  static constexpr int kThreads = kHalves * kBwdThreads;
  static constexpr int kMinBlocks = kKeyBlocks;   // __launch_bounds__: at most 128 registers either way
  static constexpr int kRowsHeld = kDelta ? KD : KW;  // key rows of h, dh a block copies
  static constexpr int HR = kRowsHeld > kChunk ? kRowsHeld : kChunk;  // rows of the h, dh slabs (copies fill 64 rows)
  static constexpr int kSlabs = kDelta ? 3 : 2;  // do, vnew (gla: v), dvnew (delta rule only)
  static constexpr bool kSw = kDelta;            // vnew, h, dh swizzled (the wgmma B operands)
  static constexpr int ldh = kSw ? kSlab : kLdV;  // floats per row of the vnew, h, dh slabs
  // one slab buffer: do, dvnew [64][kLdV], vnew [64][ldh], then h, dh [HR][ldh] (gla: do, v, h, dh)
  static constexpr int buf = (kSlabs - 1) * kSlabFloats + kChunk * ldh + 2 * HR * ldh;
  static constexpr int area = 2 * buf;
  static_assert(kHalves * 8 * KW <= buf, "the key totals X1, X2 [4][KW] per half fit in buffer 0");
  static constexpr int kRed = 16 * kChunk;  // 16 partials of v . dXu per row; then row sums
  static constexpr int kPdxu = kDelta ? kChunk * kLdC + kSlabFloats : 0;  // P', dXu (delta rule only)
  // floats: P', dXu, the two buffers, scalars (beta, gdn gates, hdh per half, reductions)
  static constexpr int floats = kPdxu + area + 2 * kChunk + kHalves * kChunk + kRed;
  static_assert(!kDelta || kChunk * kLdC <= buf, "raw P is staged in buffer 1");
  static_assert(!kSw || (kPdxu % 256 == 0 && kSlabFloats % 256 == 0 && buf % 256 == 0),
                "swizzled slabs start on 1024-byte boundaries");
  // After `floats`, where kHvQkStaged: the epilogue's q and k rows [2][64][ldq] in their 16-bit
  // dtype (KD + 8 elements: the epilogue's pair loads, 8 rows x 4 words, on distinct banks), then
  // rstd_q, rstd_k [2][64]
  static constexpr int ldq = KD + 8;
  static constexpr int kQkFloats = kChunk * ldq + 2 * kChunk;
  // then v's slab rows for slab_dxu's v . dXu, [2 buffers][64][kLdVs] 16-bit, copied with the other
  // slab copies a slab ahead
  static constexpr int kVBuf = kChunk * kLdVs / 2;
  // then, for kda, the chunk's gate cumsum rows [64][ldgc] (KD + 8 = 8 mod 32 words: the epilogue's
  // float2 loads, 16 lanes x 8 bytes a phase, on distinct banks)
  static constexpr int ldgc = KD + 8;
  static constexpr int kGateFloats = kChunk * ldgc;
  static constexpr int kGateOffset = kQkFloats + 2 * kVBuf;  // from the staged area's start
};

struct HvSmem {
  float *P, *dxu, *dO, *vn, *dvn, *h, *dh, *X1, *X2, *bet, *gsc, *hdh, *red;
  float* qk;   // the staged q, k rows (kHvQkStaged; the area after HvShape::floats)
  float* vst;  // the staged v rows of this buffer's slab (kHvQkStaged)
};

// The view of half z of slab buffer b (gla: one half per block, z names its key rows only).
template <int KD, bool kDelta>
__device__ HvSmem carve_hv(float* s, int b, int z) {
  using S = HvShape<KD, kDelta>;
  HvSmem m;
  m.qk = s + S::floats;
  m.vst = m.qk + S::kQkFloats + b * S::kVBuf;
  if constexpr (!kDelta) z = 0;
  m.P = kDelta ? s : nullptr, s += kDelta ? kChunk * kLdC : 0;
  m.dxu = kDelta ? s : nullptr, s += kDelta ? kSlabFloats : 0;
  float* bf = s + b * S::buf;
  m.dO = bf, m.dvn = kDelta ? bf + kSlabFloats : nullptr, m.vn = bf + (S::kSlabs - 1) * kSlabFloats;
  m.h = m.vn + kChunk * S::ldh + z * S::KW * S::ldh, m.dh = m.h + S::HR * S::ldh;
  m.X1 = s + 8 * z * S::KW, m.X2 = m.X1 + 4 * S::KW;
  s += S::area;
  m.bet = s, m.gsc = s + kChunk, m.hdh = s + 2 * kChunk + z * kChunk, m.red = s + (2 + S::kHalves) * kChunk;
  return m;
}

// Who a thread is: half z, thread t and warp w within the half (gla with K = 128: z from the block).
struct HvThread {
  int z, t, w;
};
template <int KD, bool kDelta>
__device__ __forceinline__ HvThread hv_thread() {
  const int i = threadIdx.x;
  const int z = HvShape<KD, kDelta>::kKeyBlocks == 2 ? int(blockIdx.x & 1) : i / kBwdThreads;
  return {z, i % kBwdThreads, (i % kBwdThreads) >> 5};
}

// ldm_a_row and ldm_b_nk2 (tile_mma.cuh) on a slab in layout kSw (the operands are stored exact).
template <bool kSw, bool S>
__device__ __forceinline__ FragA<S> ldm_a_slab(const float* s, int m0, int k0) {
  return ldm_a_at<S>([s](int r, int c) { return s + slab_off<kSw>(r, c); }, m0, k0, true);
}
template <bool kSw, bool S>
__device__ __forceinline__ void ldm_b_slab2(FragB<S>& b0, FragB<S>& b1, const float* s, int k0, int n0) {
  ldm_b_nk2_at<S>(b0, b1, [s](int n, int k) { return s + slab_off<kSw>(n, k); }, k0, n0, true);
}

// bits[u] = element off(u) of view v where in(u), else 0 (0.0 in every code), the dtype switch
// outside the element loop (load_bits switches per element: branches around every load, ncu).
template <int N, class Off, class In>
__device__ __forceinline__ void load_bits_all(uint32_t (&bits)[N], const RowsView& v, Off off, In in) {
  if (is_16bit(v.dt)) {
    const uint16_t* p = static_cast<const uint16_t*>(v.p);
#pragma unroll
    for (int u = 0; u < N; ++u) bits[u] = in(u) ? uint32_t(p[off(u)]) : 0u;
  } else if (v.dt == kF32) {
    const uint32_t* p = static_cast<const uint32_t*>(v.p);
#pragma unroll
    for (int u = 0; u < N; ++u) bits[u] = in(u) ? p[off(u)] : 0u;
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u) bits[u] = in(u) ? load_bits(v.p, v.dt, off(u)) : 0u;
  }
}

// One slab of rows [0, 64) of a [B,T,X,V] view of any dtype (do; gla's v), held in registers between
// the loads, issued a slab ahead, and the store into the slab that is computed next.
// Vector form (vec: float32, bfloat16 or float16 rows whose slab starts and row stride are aligned to
// the thread's bytes; uniform per block): thread t holds row t / kLanes, its kN adjacent columns, by
// load_row_words (chunk_bwd_tiles.cuh, as q / k groups) and stores them as float4s (ncu, gla's hv: the element form's address
// arithmetic and per-element dtype switch were ~30% of the kernel's instructions). Element form
// otherwise (float64, unaligned views): element idx = t + u NT, raw bits (load_bits), the dtype switch
// outside the loads where kHoist (load_bits_all); off for the split products, whose kernels spill ~50
// bytes with it (ptxas), a register-allocation effect of the longer code. Its two loops are split, for
// full 32-column slabs only: a shared form with a column guard and row scale spilled 20 to 236 bytes
// per thread in this kernel's instances (measured by ptxas).
template <int NT, bool kHoist>
struct SlabPrefetch {
  static constexpr int kN = kChunk * kSlab / NT;  // elements per thread
  static constexpr int kLanes = kSlab / kN;       // threads per row in the vector form
  static_assert(kN == 4 || kN == 8, "one or two 16-byte loads of float32 per thread");
  uint32_t bits[kN];  // raw: converted at the store, so the loads do not wait for each other
  int dt;
  bool vec;
  __device__ void load(const RowsView& v, int64_t t0, int x, int L, int j0) {
    dt = v.dt;
    const int64_t o = row_off(v, t0, x) + j0;
    const int es = v.dt == kF32 ? 4 : 2, al = es * kN < 16 ? es * kN : 16;
    vec = v.p && (v.dt == kF32 || v.dt == kBF16 || v.dt == kF16) &&
          ((reinterpret_cast<uintptr_t>(v.p) + uintptr_t(o * es)) % al == 0) && (v.st * es) % al == 0;
    if (vec) {
      const int r = threadIdx.x / kLanes;
      if (r < L) {
        load_row_words(bits, v.p, v.dt, o + int64_t(r) * v.st + kN * (threadIdx.x % kLanes));
      } else {
#pragma unroll
        for (int u = 0; u < kN; ++u) bits[u] = 0u;
      }
    } else if constexpr (kHoist) {
      load_bits_all(bits, v, [&](int u) { const int idx = threadIdx.x + u * NT; return o + (idx / kSlab) * v.st + idx % kSlab; },
                    [&](int u) { return v.p && (threadIdx.x + u * NT) / kSlab < L; });
    } else {
#pragma unroll
      for (int u = 0; u < kN; ++u) {
        const int idx = threadIdx.x + u * NT, r = idx / kSlab, c = idx % kSlab;
        bits[u] = v.p && r < L ? load_bits(v.p, v.dt, row_off(v, t0 + r, x) + j0 + c) : 0u;  // 0 bits: 0.0
      }
    }
  }
  template <bool kRound>  // TF32-rounded (operand_store) when the slab only feeds unsplit products
  __device__ void store(float* s) const {
    auto fin = [](float x) { return kRound ? tf32_round(x) : x; };
    if (vec) {
      float x[kN];
      row_words_values(bits, dt, x);
      float* row = s + (threadIdx.x / kLanes) * kLdV + kN * (threadIdx.x % kLanes);
#pragma unroll
      for (int i = 0; i < kN; i += 4)
        *reinterpret_cast<float4*>(row + i) = make_float4(fin(x[i]), fin(x[i + 1]), fin(x[i + 2]), fin(x[i + 3]));
      return;
    }
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      const int idx = threadIdx.x + u * NT;
      s[(idx / kSlab) * kLdV + idx % kSlab] = fin(bits_to_float(bits[u], dt));
    }
  }
};

// v at the four accumulator positions of this thread's dXu tile in slab_dxu (rows m0 + g, m0 + g + 8,
// columns n0 + 2 t, + 1 of warp W's tile: m0 = 16 (W % 4), n0 = 8 (W / 4)), raw, loaded before the
// P^T dvnew product and used after it (v . dXu for dbeta).
struct SlabV {
  uint32_t bits[4];
  __device__ void load(const RowsView& v, int64_t t0, int x, int L, int j0) {
    const int W = threadIdx.x >> 5, m0 = 16 * (W & 3), n0 = 8 * (W >> 2);
    const int64_t o = row_off(v, t0, x) + j0;
    load_bits_all(bits, v, [&](int e) { return o + acc_row(m0, e) * v.st + acc_col(n0, e); },
                  [&](int e) { return acc_row(m0, e) < L; });
  }
};

// The cp.async copies of one [kRows][32] float slab from rows of g (row stride ldg, already offset to
// the slab's first column; rows >= L zero-filled): thread t copies quads t + u NT, i.e. row t / 8 +
// u NT / 8, columns 4 (t % 8) .. + 3 (copy_rows_async's mapping, which round_own_copies relies on),
// without its division and loop bound (issue_slab's copies were a tenth of hv's instructions, ncu).
template <int NT, int kRows, bool kSw = false>
__device__ __forceinline__ void copy_slab_async(float* s, const float* g, int64_t ldg, int L) {
  static_assert(NT % 8 == 0 && (kRows * 8) % NT == 0, "whole rows per pass");
  const int r0 = int(threadIdx.x) >> 3, c = 4 * (int(threadIdx.x) & 7);
#pragma unroll
  for (int u = 0; u < kRows * 8 / NT; ++u) {
    const int r = r0 + u * (NT / 8);
    cp_async16(s + slab_off<kSw>(r, c), g + (r < L ? r : 0) * ldg + c, r < L);
  }
}

// Which (chunk, value head) item block b works on: chunks of one head are consecutive (the order of
// blockIdx.x); gla with K = 128 has two blocks per item, adjacent, key rows [64 z, 64 z + 64) each.
struct HvItem {
  ChunkInfo ck;
  int hv;
  int64_t blk;  // chunk * HV + hv: the [NT,HV,...] workspace slot
  int key0;     // the first key row of h, dh this block copies
};
template <int KD, bool kDelta>
__device__ __forceinline__ HvItem hv_item(const ChunkParams& p, int b) {
  using S = HvShape<KD, kDelta>;
  const int i = b / S::kKeyBlocks, c = i % p.NT, hv = i / p.NT;
  return {chunk_at(p, c), hv, int64_t(c) * p.HV + hv, (b % S::kKeyBlocks) * S::KW};
}

// Issues the cp.async copies of slab j0 into buffer view s (half 0's: h, dh from row 0): vnew and
// dvnew (delta rule; gla reads v by SlabPrefetch, and its dv = dvnew is written by dhu), the block's
// key rows of h and dh (all K with the delta rule; 64 rows when fewer, the rest zero).
template <int KD, bool kDelta, int NT>
__device__ void issue_slab(const BwdParams& bp, const HvSmem& s, const HvItem& it, int j0) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const ChunkInfo& ck = it.ck;
  const int64_t ldv = int64_t(p.HV) * p.V, row0 = (int64_t(ck.t0) * p.HV + it.hv) * p.V + j0;
  const int64_t h0 = (it.blk * KD + it.key0) * p.V + j0;
  if constexpr (kDelta) copy_slab_async<NT, kChunk, S::kSw>(s.vn, bp.vnew + row0, ldv, ck.len);
  if constexpr (kDelta) copy_slab_async<NT, kChunk>(s.dvn, bp.dvnew + row0, ldv, ck.len);  // gla: dv written by dhu
  copy_slab_async<NT, S::HR, S::kSw>(s.h, bp.h + h0, p.V, S::kRowsHeld);
  copy_slab_async<NT, S::HR, S::kSw>(s.dh, bp.dh + h0, p.V, S::kRowsHeld);
  cp_async_commit();
}

// Right after this thread's cp_async_wait_all, before the slab's barrier: the thread rounds to TF32
// (kRound: products not split) the elements it copied itself in issue_slab, the only ones it may
// touch before the barrier (copy_slab_async's mapping: quad idx = row idx / 8, columns 4 (idx % 8) ..
// + 3 of each 64-row block; every copy of issue_slab uses it). Every product operand of a slab is then
// stored rounded and its fragments load without conversion (four warps share each B fragment and
// each converted it; ncu counted those conversions as hv's largest issue cost, yet removing them moved
// hv by ~1.5%: docs/BENCHMARKS.md, eighth session). vnew, dvnew only with the delta rule
// (gla copies neither). rowsum(h dh) of the slab is taken from the exact values first: the
// row's 8 threads sum their four-element dots by shuffles into hdh[key row] (s is half 0's view,
// whose hdh spans both halves: half z's key rows start at 64 z; gla: the block's own rows).
template <int KD, bool kDelta, bool kRound, int NT>
__device__ void round_own_copies(const HvSmem& s) {
  constexpr int kQuads = kSlab / 4;
  static_assert(NT % 32 == 0 && (kChunk * kQuads) % NT == 0, "uniform trips: whole warps shuffle");
  auto round4 = [](float* p) {
    const float4 x = lds4(p);
    *reinterpret_cast<float4*>(p) = make_float4(tf32_round(x.x), tf32_round(x.y), tf32_round(x.z), tf32_round(x.w));
  };
  constexpr bool kSw = HvShape<KD, kDelta>::kSw;
#pragma unroll
  for (int idx = threadIdx.x; idx < kChunk * kQuads; idx += NT) {
    const int r = idx / kQuads, c = 4 * (idx % kQuads);
    if constexpr (kRound && kDelta) round4(s.vn + slab_off<kSw>(r, c)), round4(s.dvn + r * kLdV + c);
#pragma unroll
    for (int r0 = 0; r0 < HvShape<KD, kDelta>::kRowsHeld; r0 += kChunk) {
      float* h = s.h + slab_off<kSw>(r0 + r, c);
      float* dh = s.dh + slab_off<kSw>(r0 + r, c);
      float x = dot4(lds4(h), lds4(dh), 0.0f);
      if constexpr (kRound) round4(h), round4(dh);
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      if ((idx % kQuads) == 0 && r0 + r < HvShape<KD, kDelta>::kRowsHeld) s.hdh[r0 + r] += x;
    }
  }
}

// An item's first loads, all cp.async (one commit): raw P staged in buffer 1, gdn's gates and beta,
// slab 0 into buffer 0 (waited for by hv_start).
template <int KD, bool kKDA, bool kDelta>
__device__ void hv_issue(const BwdParams& bp, float* smem, const HvItem& it) {
  constexpr int NT = HvShape<KD, kDelta>::kThreads;
  const ChunkParams& p = bp.c;
  const ChunkInfo& ck = it.ck;
  const HvSmem s = carve_hv<KD, kDelta>(smem, 0, 0);
  float* stage = carve_hv<KD, kDelta>(smem, 1, 0).dO;
  if constexpr (kDelta) copy_rows_async<NT>(stage, kLdC, p.P + it.blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  if constexpr (!kKDA) copy_gates_async<false, NT>(s.gsc, 0, p, ck, it.hv, 0, 1);
  for (int r = threadIdx.x; r < kChunk; r += NT)  // rows >= len: zero-filled
    cp_async4(s.bet + r, p.beta_e + int64_t(ck.t0 + min(r, ck.len - 1)) * p.HV + it.hv, r < ck.len);
  issue_slab<KD, kDelta, NT>(bp, s, it, 0);
}

// Before the slab loop (hv_issue's copies in flight): hdh = 0, the copies waited for, P transposed
// from its stage (P', TF32-rounded unless kSplit: it only enters P^T dvnew).
template <int KD, bool kDelta, bool kSplit>
__device__ void hv_start(float* smem) {
  using S = HvShape<KD, kDelta>;
  constexpr int NT = S::kThreads;
  const HvSmem s = carve_hv<KD, kDelta>(smem, 0, 0);
  const float* stage = carve_hv<KD, kDelta>(smem, 1, 0).dO;
  for (int r = threadIdx.x; r < S::kHalves * kChunk; r += NT) s.hdh[r] = 0.0f;  // half 0's view starts both
  cp_async_commit();  // the staged q, k rows' group, if any (kHvQkStaged): left in flight
  cp_async_wait<kHvQkStaged<kDelta, kSplit> ? 1 : 0>();
  __syncthreads();
  if constexpr (kDelta)
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += NT) {
      const int a = idx % kChunk, b = idx / kChunk;  // P'[a][b]: unit diagonal, strictly lower P; stored transposed
      s.P[b * kLdC + a] = a == b ? 1.0f : (a > b ? operand_store<kSplit>(stage[a * kLdC + b]) : 0.0f);
    }
}

}  // namespace kcp::cuda::hv
