// Shared-memory plan of kda's transposed chain (chunk_state_kda.cu) and its cp.async copies.
//   Two stages (chunk c+1 copies while chunk c computes), 128-byte-swizzled (wg::sw128_offset):
//   w [64][K] and kg^T [K][64] float (rows at ra_row: the register-operand order), u [64][64 + 4]
//   float row-major (also o's staging), Aqk [64][64] float (only the 8x8 blocks on and below the
//   diagonal are copied; the rest stays zero), 2^(b_end) [K]; qg [64][K] float in one buffer. 227 KB
//   at K = 128.
// Consecutive threads copy consecutive 16-byte pieces of one row (whole 128-byte lines from L2), so a
// copy costs a few instructions a piece. Covered through the chain's tests
// (tests/cuda/test_cuda_kda_chain.cpp, test_cuda_keep.cpp, test_cuda_transition.cpp).
#pragma once

#include "cuda/chunk_params.cuh"
#include "cuda/chunk_state_kda.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/wgmma.cuh"

namespace kcp::cuda::kda_chain {

constexpr int kThreads = 128, BV = kKdaChainBV, NA = BV / 2, kLdU = BV + 4;  // u rows padded (2-way conflicts at most)

// Tile row of true row l (8-row groups: l -> 2l for l < 4, 2(l - 4) + 1 for l >= 4); perm_pos inverts it.
__device__ __forceinline__ int ra_row(int l) { return (l & ~7) | ((l & 3) << 1) | ((l >> 2) & 1); }

template <int KD>
struct KdaSmem {
  static constexpr int bytes_w = 4 * kChunk * KD;        // w, qg [64][KD] float, 128B-swizzled
  static constexpr int bytes_u = 4 * kChunk * kLdU;      // u [64][BV + 4] float, row-major
  static constexpr int bytes_a = bytes_w + bytes_u;      // w, u: one stage of two
  static constexpr int bytes_kt = 4 * KD * kChunk;       // kg^T [KD][64] float, 128B-swizzled
  static constexpr int bytes_aqk = 4 * kChunk * kChunk;  // Aqk [64][64] float, 128B-swizzled
  static constexpr int bytes_b = bytes_kt + bytes_aqk;   // kg^T, Aqk: one stage of two
  static constexpr int bytes = 2 * bytes_a + bytes_w + 2 * bytes_b + 2 * 4 * KD;  // + qg (one) + decay (two)
  static_assert(bytes_a % 1024 == 0 && bytes_b % 1024 == 0, "swizzled tiles need 1024-byte alignment");
  char* base;
  __device__ explicit KdaSmem(char* b) : base(b) {}
  __device__ char* Ws(int st) const { return base + st * bytes_a; }
  __device__ float* Us(int st) const { return reinterpret_cast<float*>(Ws(st) + bytes_w); }
  __device__ char* Qs() const { return base + 2 * bytes_a; }
  __device__ char* Kt(int st) const { return Qs() + bytes_w + st * bytes_b; }
  __device__ char* As(int st) const { return Kt(st) + bytes_kt; }
  __device__ float* decay(int st) const { return reinterpret_cast<float*>(Kt(2)) + st * KD; }  // kg_decay's row
};

using wg::adv;

// 16-byte copies of a float tile of kRows rows x kCols into its swizzled layout, row r from
// src + r * stride to tile row (kPerm ? ra_row(r) : r), rows >= L zero-filled (kFull: L >= kRows, no
// test). Consecutive threads take consecutive 16-byte pieces of one row (whole 128-byte lines from
// L2); a thread's source steps by a constant and its destinations are compile-time offsets of one or
// two bases, so a copy costs a few instructions.
template <int kRows, int kCols, bool kPerm, bool kFull>
__device__ __forceinline__ void copy_tile_swizzled(char* dst, const float* src, int64_t stride, int L) {
  constexpr int cpr = kCols / 4, rpp = kThreads / cpr, groups = 8 / rpp;
  static_assert(rpp == 4 || rpp == 8, "4 or 8 rows per pass");
  const int r0 = int(threadIdx.x) / cpr, ch = int(threadIdx.x) % cpr;
  char* d[groups];
#pragma unroll
  for (int j = 0; j < groups; ++j)
    d[j] = dst + wg::sw128_offset<float>(kPerm ? ra_row(r0 + rpp * j) : r0 + rpp * j, 4 * ch, kRows);
  const float* s0 = src + 4 * ch;
  const float* sr = s0 + r0 * stride;
  const int64_t step = rpp * stride;
#pragma unroll
  for (int i = 0; i < kRows / rpp; ++i, sr += step) {
    const bool valid = kFull || r0 + rpp * i < L;
    cp_async16(d[i % groups] + 1024 * (i / groups), valid ? sr : s0, valid);
  }
}

// The tiles of chunk ck (index ci) but qg, into stage st: w (rows at ra_row), u's columns [v0, v0 + 64)
// (none for M's columns: u = 0 there, the tile zero from the start), 2^(b_end) (the WY stage's kg_decay
// row), kg^T (rows at ra_row) and, with an output, the 8x8 blocks of Aqk on and below the diagonal (the
// others stay zero from the start).
template <int KD, bool kOut>
__device__ void issue_tiles(const StateParams& sp, const ChunkInfo& ck, int ci, int hv, int v0, const KdaSmem<KD>& s,
                            int st) {
  const ChunkParams& p = sp.c;
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;
  const int uw = u_width(sp);
  const bool with_u = kOut || v0 < uw;  // M's columns only in the transition (no output); block-uniform
  auto copy = [&](auto full) {
    constexpr bool kFull = decltype(full)::value;
    copy_tile_swizzled<kChunk, KD, true, kFull>(s.Ws(st), p.w + row0 * KD, int64_t(p.HV) * KD, ck.len);
    if (with_u) copy_rows_async<kChunk, 4 * BV, kThreads, kFull>(s.Us(st), kLdU, ck.len, sp.u + row0 * uw + v0, p.HV * uw);
  };
  with_full_chunk(ck.len, copy);
  if (int(threadIdx.x) < KD / 4)
    cp_async16(s.decay(st) + 4 * threadIdx.x, p.kg_decay + (int64_t(ci) * p.HV + hv) * KD + 4 * threadIdx.x, true);
  copy_tile_swizzled<KD, kChunk, true, true>(s.Kt(st), p.kg_t + (int64_t(ci) * p.HV + hv) * KD * kChunk, kChunk, KD);
  if constexpr (!kOut) return;
  const int r0 = int(threadIdx.x) >> 4, ch = int(threadIdx.x) & 15;
  const float* A = p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk + r0 * kChunk + 4 * ch;
  char* at = s.As(st) + wg::sw128_offset<float>(r0, 4 * ch, kChunk);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (ch < 2 * (i + 1)) cp_async16(at + 1024 * i, A + 512 * i, true);
}

// qg of chunk ck (its single buffer).
template <int KD>
__device__ void issue_qg(const ChunkParams& p, const ChunkInfo& ck, int hv, const KdaSmem<KD>& s) {
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;
  if (ck.len == kChunk) copy_tile_swizzled<kChunk, KD, false, true>(s.Qs(), p.qg + row0 * KD, int64_t(p.HV) * KD, kChunk);
  else copy_tile_swizzled<kChunk, KD, false, false>(s.Qs(), p.qg + row0 * KD, int64_t(p.HV) * KD, ck.len);
}

}  // namespace kcp::cuda::kda_chain
