// Backward stage "chunk": every per-chunk gradient once dh and dvnew are known (CPU twins
// chunk_bwd_ht_products, chunk_inter_backward, chunk_wy_backward, chunk_intra_backward,
// chunk_gate_cumsum_backward), as three kernels and a sum:
//   hv    (chunk_bwd_hv.cu,    grid (chunks, HV, 2)):    products over V with h, dh, do, vnew, dvnew;
//         dq, dk inter + WY parts, dv, the inter gate terms; dA and W1 = dvnew vnew^T to the workspace
//   wy    (chunk_bwd_wy.cu,    grid (chunks, HV)):       gated k gram G, dP, T = P^T dP, dL; dbeta_e = dL . G
//   intra (chunk_bwd_intra.cu, grid (chunks, HV, K/32)): the intra products through dA, dL; the intra gate terms
//   gdn: wy and intra as one kernel (chunk_bwd_intra_gdn.cu, grid (chunks, HV)), dL kept in shared memory
//   sum   (here, one thread per (token, value head)):    dbeta_e += kernel hv's partials; gdn: da = sum of
//         the partials of kernels hv and intra, in a fixed order (deterministic, no atomics).
// gla (ChunkParams::gla, no delta rule): kernel hv gives dv = dvnew, kernel wy and the sum do not run
// (no dbeta; dbeta_e is left unwritten), kernel intra takes dL = 0.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"

#include "cuda/cuda_check.cuh"

namespace kcp::cuda {
namespace {

constexpr int kSumThreads = 256;

__global__ void __launch_bounds__(kSumThreads) bwd_chunk_sum_kernel(const BwdParams bp) {
  const int64_t e = int64_t(blockIdx.x) * kSumThreads + threadIdx.x;
  if (e >= bp.c.TT * bp.c.HV) return;
  const float* pt = bp.part + e * kPartSlots;
  bp.dbeta_e[e] = bp.dbeta_e[e] + pt[kPartDbetaHv] + pt[kPartDbetaHv + 1];
  if (bp.c.kda) return;
  bp.da[e] = pt[kPartDaHv] + pt[kPartDaHv + 1] + pt[kPartDaIntra];
}

}  // namespace

void launch_bwd_chunk_sum(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  const int64_t n = p.TT * p.HV;
  if (n == 0 || p.gla) return;  // gla: no dbeta; da is per channel (written by kernels hv and intra)
  launch_kernel(bwd_chunk_sum_kernel, dim3(unsigned((n + kSumThreads - 1) / kSumThreads)), dim3(kSumThreads), 0, stream, bp);
}

void launch_bwd_chunk(const BwdParams& bp, cudaStream_t stream) {
  if (bp.c.NT == 0) return;
  launch_bwd_hv(bp, stream);
  launch_bwd_wy(bp, stream);
  launch_bwd_intra(bp, stream);
  launch_bwd_chunk_sum(bp, stream);
}

void launch_bwd_wy(const BwdParams& bp, cudaStream_t stream) {
  // gla: P = I, no Lmat: nothing to differentiate; gdn: inside its intra kernel (chunk_bwd_intra_gdn.cu)
  if (bp.c.kda && !bp.c.gla) launch_bwd_wy_kernel(bp, stream);
}

}  // namespace kcp::cuda
