// Backward stage "chunk", kernel 2 of 3 for kda: the WY backward through (I + Lmat)^-1
// (chunk_bwd_wy_tiles.cuh has the algebra), its dL into the workspace (bp.Wc, over W1) for kernel
// intra. Grid (chunks, HV), 256 threads, 74.5 KB of shared memory: three blocks per multiprocessor.
// gdn runs the same code inside its fused wy + intra kernel (chunk_bwd_intra_gdn.cu); gla has no WY
// backward. Until 2026-11-29 kda's gram was formed here again, in float32 FMA over anchored 32-key
// slabs (0.96 ms at T = 32768, H = 16, against gdn's 0.46 on tensor cores).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_wy_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {
namespace {

using namespace wy;

template <int KD, bool kSplit>
__global__ void __launch_bounds__(kBwdThreads, 3) bwd_wy_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkInfo ck = chunk_at(bp.c, blockIdx.x);
  const int hv = blockIdx.y;
  const int64_t blk = int64_t(blockIdx.x) * bp.c.HV + hv;
  extern __shared__ __align__(16) float smem[];
  const WySmem s(smem);
  float gram[4][4], dl[4][4];  // gram: gdn's only
  wy_backward<KD, true, kSplit>(bp, s, ck, hv, blk, gram, dl);
  float* Wg = bp.Wc + blk * kChunk * kChunk;  // dL over W1: this block's W1 is in shared memory
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) Wg[nt_row(e) * kChunk + nt_col(j, e)] = dl[j][e];
}

}  // namespace

void launch_bwd_wy_kernel(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  KCP_CHECK(p.kda && p.Gk, "bwd_wy: kda's, with the gram kkt keeps (ChunkParams::Gk); gdn's runs in kernel intra");
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    launch_kernel(bwd_wy_kernel<KD, decltype(split)::value>, dim3(p.NT, p.HV), dim3(kBwdThreads),
                  sizeof(float) * WySmem::floats, stream, bp);
  });
}

}  // namespace kcp::cuda
