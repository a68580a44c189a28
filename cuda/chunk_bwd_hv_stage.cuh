// Kernel hv's staged rows (chunk_bwd_hv.cu, kHvQkStaged: the delta rule with 16-bit inputs): the
// inputs its epilogue and slab_dxu read at accumulator positions, copied into shared memory by cp.async
// with the copies they ride along with, instead of loaded from global memory where they are used
// (each such load waited a round trip with nothing to overlap it: one block a multiprocessor).
//   q, k rows [2][64][K + 8] 16-bit and rstd_q, rstd_k [2][64]   (issue_qk_rows, a group after slab 0's)
//   v's slab rows [2 buffers][64][kLdVs] 16-bit                   (issue_slab_v, a slab ahead)
//   kda: the gate cumsum rows [64][K + 8] float                   (issue_qk_rows)
// The area follows HvShape::floats (HvSmem::qk, HvSmem::vst; offsets in HvShape).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" and end to end, bf16 and fp16 inputs).
#pragma once

#include "cuda/chunk_bwd_hv_tiles.cuh"

namespace kcp::cuda::hv {

// The staged rows of q (x = 0) or k (x = 1), row r at qk_row(...) + r * ldq, and their rstd [64].
template <int KD>
__device__ __forceinline__ const uint16_t* qk_row(const float* area, int x) {
  return reinterpret_cast<const uint16_t*>(area) + x * kChunk * HvShape<KD, true>::ldq;
}
template <int KD>
__device__ __forceinline__ const float* qk_rstd(const float* area, int x) {
  return area + kChunk * HvShape<KD, true>::ldq + x * kChunk;
}
// kda's staged gate cumsum, row r at staged_gates(...) + r * ldgc.
template <int KD>
__device__ __forceinline__ const float* staged_gates(const float* area) {
  return area + HvShape<KD, true>::kGateOffset;
}
// The floats kernel hv's launch adds after HvShape::floats.
template <int KD, bool kKDA, bool kDelta, bool kSplit>
constexpr int kHvStagedFloats =
    kHvQkStaged<kDelta, kSplit> ? HvShape<KD, true>::kGateOffset + (kKDA ? HvShape<KD, true>::kGateFloats : 0) : 0;
// Keys d, d + 1 (d even) of staged row r of q (x = 0) or k (x = 1), times rstd with the fused norm:
// the values qk_pair_load / qk_pair_value give for the same elements.
template <int KD>
__device__ __forceinline__ float2 staged_qk_pair(const float* area, int x, int r, int d, int dt, bool norm) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(qk_row<KD>(area, x) + r * HvShape<KD, true>::ldq + d);
  const float2 y = dt == kBF16 ? make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u))
                               : make_float2(bits_to_float(w & 0xffffu, kF16), bits_to_float(w >> 16, kF16));
  const float sc = norm ? qk_rstd<KD>(area, x)[r] : 1.0f;
  return make_float2(y.x * sc, y.y * sc);
}

// The copies of kHvQkStaged: q's and k's 64 rows of the item's chunk (rows >= len zero-filled) into
// `area`, with the fused norm their rstd rows, and for kda the gate cumsum rows.
template <int KD, bool kKDA, int NT>
__device__ void issue_qk_rows(const ChunkParams& p, float* area, const HvItem& it) {
  using S = HvShape<KD, true>;
  const ChunkInfo& ck = it.ck;
  const int h = it.hv / p.G;
  auto* rows = reinterpret_cast<uint16_t*>(area);
  const auto* q = static_cast<const uint16_t*>(p.q.p) + (ck.t0 * p.q.st + int64_t(h) * p.q.sx);
  const auto* k = static_cast<const uint16_t*>(p.k.p) + (ck.t0 * p.k.st + int64_t(h) * p.k.sx);
  copy_rows_async<kChunk, 2 * KD, NT>(rows, S::ldq, ck.len, q, int(p.q.st));
  copy_rows_async<kChunk, 2 * KD, NT>(rows + kChunk * S::ldq, S::ldq, ck.len, k, int(p.k.st));
  if (p.l2norm && threadIdx.x < 2 * kChunk) {
    const int x = threadIdx.x / kChunk, r = threadIdx.x % kChunk;
    const float* rstd = x == 0 ? p.rstd_q : p.rstd_k;
    cp_async4(area + kChunk * S::ldq + threadIdx.x, rstd + (int64_t(ck.t0) + min(r, ck.len - 1)) * p.H + h, r < ck.len);
  }
  if constexpr (kKDA)
    copy_rows_async<kChunk, 4 * KD, NT>(area + S::kGateOffset, S::ldgc, ck.len, p.gcum + (int64_t(ck.t0) * p.HV + it.hv) * KD,
                                       p.HV * KD);
}

// The copies of v's slab at column j0 into s.vst (kHvQkStaged; rows >= len zero-filled), issued
// before issue_slab, whose commit takes them.
template <int NT>
__device__ __forceinline__ void issue_slab_v(const ChunkParams& p, const HvSmem& s, const HvItem& it, int j0) {
  const auto* v = static_cast<const uint16_t*>(p.v.p) + (it.ck.t0 * p.v.st + int64_t(it.hv) * p.v.sx + j0);
  copy_rows_async<kChunk, 2 * kSlab, NT>(reinterpret_cast<uint16_t*>(s.vst), kLdVs, it.ck.len, v, int(p.v.st));
}

}  // namespace kcp::cuda::hv
