// gla's forward state stage for one sequence with its chain walked as two halves at once. gla's M is
// diagonal (ALGORITHMS.md 3: no delta rule), so the state entering chunk c >= mid is
//   S_c = h_local[c] + D_c s_mid,   D_c[i] = prod_{mid <= c' < c} 2^(b_end[c', i])   (per key row i)
// with h_local the chain from 0 at chunk mid and s_mid the first half's final state: the two halves
// run at once (chunk_state_gla.cu, StateParams::mid: 2 x 256 blocks at H = 16, K = V = 128, three
// stages each so that all are resident), and the final state is f_local + D_NT s_mid. The chain's
// 512 dependent steps at T = 32768 become 256; where the doubled blocks share multiprocessors (H = 16)
// each step slows by more than that saves, so the automatic rule takes the halves only for few heads
// (chunkwise.cu halves_apply; docs/BENCHMARKS.md, twenty-third session).
//   decay:      written by the second half's chain blocks as they walk (one lane per key pair of the
//               first 32 state columns: the chain's own exp2f factors in its order), D_mid = 1,
//               D_NT into row NT.
//   correction: with an output, the output kernel forms S_c on its h tile in shared memory (and writes
//               it back to h where sp.mid_store_h: the kept forward); without one (the backward's
//               recompute), gla_halves_h_kernel forms it in h, one thread per 4 elements, by the same
//               fmaf, so both leave the same h bit for bit.
//   final:      final_state (any dtype, strided) = f_local + D_NT s_mid, one thread per element.
// Covered by tests/cuda/test_cuda_gla_halves.cpp (against the oracle; kept and plain forwards, kept
// and recomputing backwards bit for bit).
#include "cuda/chunk_state_gla.cuh"

#include <algorithm>

#include "cuda/cuda_check.cuh"
#include "cuda/device_math.cuh"

namespace kcp::cuda {
namespace {

// h[c] = fmaf(D_c[i], s_mid[i, j], h_local[c][i, j]) for c >= mid: four elements per thread.
__global__ void gla_halves_h_kernel(const StateParams sp) {
  const ChunkParams& p = sp.c;
  const int64_t per = int64_t(p.K) * p.V / 4, n = int64_t(p.NT - sp.mid) * p.HV * per;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = e / per;  // (c - mid) HV + hv
    const int hv = int(ch % p.HV), c = sp.mid + int(ch / p.HV), i = int(e % per * 4 / p.V);
    const float d = sp.decay[(int64_t(c) * p.HV + hv) * p.K + i];
    const float4 m = reinterpret_cast<const float4*>(sp.s_mid)[hv * per + e % per];
    float4* x = reinterpret_cast<float4*>(sp.h) + (int64_t(c) * p.HV + hv) * per + e % per;
    const float4 a = *x;
    *x = make_float4(fmaf(d, m.x, a.x), fmaf(d, m.y, a.y), fmaf(d, m.z, a.z), fmaf(d, m.w, a.w));
  }
}

__global__ void gla_halves_final_kernel(const StateParams sp) {
  const ChunkParams& p = sp.c;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per = int64_t(p.K) * p.V;
  if (e >= p.HV * per) return;
  const int hv = int(e / per), i = int(e % per / p.V), j = int(e % p.V);
  const float d = sp.decay[(int64_t(p.NT) * p.HV + hv) * p.K + i];
  const StateView& f = sp.final_state;
  store_any(f.p, f.dt, hv * f.shv + i * f.si + j * f.sj, fmaf(d, sp.s_mid[e], sp.f_local[e]));
}

}  // namespace

void launch_gla_state_halves(const StateParams& sp, int input_dtype, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.gla && p.N == 1 && sp.mid > 0 && sp.mid < p.NT && sp.s_mid && sp.f_local && sp.decay && sp.h &&
                p.V % 4 == 0 && is_16bit(input_dtype),
            "gla state in halves: expected one sequence of more than mid = ", sp.mid, " chunks, 16-bit inputs, ",
            "V a multiple of 4, the stored states and the halves' buffers");
  if (p.HV == 0) return;
  launch_gla_state(sp, input_dtype, stream);  // the halves (D_c on the way), then (sp.o) the output
  if (!sp.o.p) {
    const int64_t n = int64_t(p.NT - sp.mid) * p.HV * p.K * p.V / 4;
    launch_kernel(gla_halves_h_kernel, dim3(unsigned(std::min<int64_t>((n + 255) / 256, 4096))), dim3(256), 0, stream, sp);
  }
  if (sp.final_state.p) launch_gla_halves_final(sp, stream);
}

void launch_gla_halves_final(const StateParams& sp, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.N == 1 && sp.mid > 0 && sp.s_mid && sp.f_local && sp.decay && sp.final_state.p,
            "gla halves' final state: expected one sequence, the halves' buffers and a final_state view");
  const int64_t n = int64_t(p.HV) * p.K * p.V;
  if (n > 0) launch_kernel(gla_halves_final_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, sp);
}

}  // namespace kcp::cuda
