// gla's forward state stage for one sequence with its chain walked as two halves at once. gla's M is
// diagonal (ALGORITHMS.md 3: no delta rule), so the state entering chunk c >= mid is
//   S_c = h_local[c] + D_c s_mid,   D_c[i] = prod_{mid <= c' < c} 2^(b_end[c', i])   (per key row i)
// with h_local the chain from 0 at chunk mid and s_mid the first half's final state: the two halves
// run at once (chunk_state_gla.cu, StateParams::mid: 2 x 256 blocks at H = 16, K = V = 128, three
// stages each so that all are resident), the output adds scale (qg D_c) s_mid for the second half's
// chunks (chunk_output_gla.cu), and the final state is f_local + D_NT s_mid. The chain's 512
// dependent steps at T = 32768 become 256 (~0.5 ms of the forward's 1.28). h of the second half holds
// h_local, so only the plain forward (nothing reads h after the output) takes this path.
//   decay scan: one block per value head, one thread per key, the chunk factors multiplied in order
//               (the chain's own exp2f factors), D_mid = 1, D_NT into row NT.
//   combine:    final_state (any dtype, strided) = f_local + D_NT s_mid, one thread per element.
// Covered by tests/cuda/test_cuda_gla_halves.cpp (against the unsplit chain and the oracle).
#include "cuda/chunk_state_gla.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/device_math.cuh"

namespace kcp::cuda {
namespace {

__global__ void gla_decay_scan_kernel(const StateParams sp, float* decay) {
  const ChunkParams& p = sp.c;
  const int hv = blockIdx.x, i = threadIdx.x;
  const SeqTokens tok = seq_tokens(p, 0, p.NT);
  float d = 1.0f;
#pragma unroll 8
  for (int c = sp.mid; c < p.NT; ++c) {
    decay[(int64_t(c) * p.HV + hv) * p.K + i] = d;
    d *= exp2f(p.gcum[(int64_t(tok.last(c)) * p.HV + hv) * p.K + i]);
  }
  decay[(int64_t(p.NT) * p.HV + hv) * p.K + i] = d;
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
  KCP_CHECK(p.gla && p.N == 1 && sp.mid > 0 && sp.mid < p.NT && sp.s_mid && sp.f_local && sp.decay && sp.h && sp.o.p &&
                p.K <= 1024 && (input_dtype == kBF16 || input_dtype == kF16),
            "gla state in halves: expected one sequence of more than mid = ", sp.mid, " chunks, 16-bit inputs, ",
            "K <= 1024, the stored states, the output and the halves' buffers");
  if (p.HV == 0) return;
  launch_kernel(gla_decay_scan_kernel, dim3(p.HV), dim3(p.K), 0, stream, sp, sp.decay);
  launch_gla_state(sp, input_dtype, stream);
  if (sp.final_state.p) {
    const int64_t n = int64_t(p.HV) * p.K * p.V;
    launch_kernel(gla_halves_final_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, sp);
  }
}

}  // namespace kcp::cuda
