// Device helpers of gla's chains walked as two halves at once (chunk_state_gla_halves.cu): the state
// of a chunk in the half walked second, formed on the tile a consumer kernel copied into shared memory,
//   S_c = S_local_c + D_c S_mid     (D_c per key row i, S_mid the first half's last state)
// by one fmaf per element, on the segments this thread copied (copy_rows_async's mapping, before their
// TF32 rounding), written back to the tile's global rows where `back` is set. Used by gla's output
// (the forward's h) and its dv pass (the backward's dh); gla_halves_h_kernel forms the same values in
// place where no consumer runs. Covered by tests/cuda/test_cuda_gla_halves.cpp.
#pragma once

#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

// tile [KD, BV] at Hs (row stride ldh); d: D_c's KD keys; m: S_mid's tile (row stride ldm); back: the
// tile's global rows (row stride ldm) or null.
template <int KD, int BV, int kThreads>
__device__ __forceinline__ void correct_own_rows(const float* d, const float* m, float* back, int ldm, float* Hs, int ldh) {
  for_own_segments<KD, 4 * BV, kThreads>([&](int r, int sg) {
    float4* x = reinterpret_cast<float4*>(Hs + r * ldh + 4 * sg);
    const float4 a = *x, b = *reinterpret_cast<const float4*>(m + int64_t(r) * ldm + 4 * sg);
    const float dr = d[r];
    const float4 y = make_float4(fmaf(dr, b.x, a.x), fmaf(dr, b.y, a.y), fmaf(dr, b.z, a.z), fmaf(dr, b.w, a.w));
    *x = y;
    if (back) *reinterpret_cast<float4*>(back + int64_t(r) * ldm + 4 * sg) = y;
  });
}

}  // namespace kcp::cuda
