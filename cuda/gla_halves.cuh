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
// tile's global rows (row stride ldm) or null. The segments' S_mid and D_c are all loaded before the
// first is used (in one loop with the stores to `back`, each load waited out a round trip to L2:
// the correcting output took about as long as the chain and the output together, twenty-third session).
template <int KD, int BV, int kThreads>
__device__ __forceinline__ void correct_own_rows(const float* __restrict__ d, const float* __restrict__ m,
                                                 float* __restrict__ back, int ldm, float* Hs, int ldh) {
  constexpr int segs = BV / 4, total = KD * segs, n = (total + kThreads - 1) / kThreads;
  float4 b[n];
  float dr[n];
#pragma unroll
  for (int u = 0; u < n; ++u) {  // for_own_segments' mapping
    const int idx = int(threadIdx.x) + u * kThreads, r = idx / segs, sg = idx % segs;
    if (n * kThreads > total && idx >= total) break;
    b[u] = __ldg(reinterpret_cast<const float4*>(m + int64_t(r) * ldm + 4 * sg)), dr[u] = __ldg(d + r);
  }
#pragma unroll
  for (int u = 0; u < n; ++u) {
    const int idx = int(threadIdx.x) + u * kThreads, r = idx / segs, sg = idx % segs;
    if (n * kThreads > total && idx >= total) break;
    float4* x = reinterpret_cast<float4*>(Hs + r * ldh + 4 * sg);
    const float4 a = *x;
    const float4 y = make_float4(fmaf(dr[u], b[u].x, a.x), fmaf(dr[u], b[u].y, a.y), fmaf(dr[u], b[u].z, a.z),
                                 fmaf(dr[u], b[u].w, a.w));
    *x = y;
    if (back) *reinterpret_cast<float4*>(back + int64_t(r) * ldm + 4 * sg) = y;
  }
}

}  // namespace kcp::cuda
