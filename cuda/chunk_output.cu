// Stage "output", one block of 4 warps per (chunk c, value head hv, 32 columns [v0, v0+32)):
//   gdn: o_r = scale * 2^(b_r) * (q_r @ h[c]) + sum_{s<=r} Aqk[r,s] vnew_s    (q L2-normalized if fused)
//   kda: o_r = scale * (qg_r @ h[c])          + sum_{s<=r} Aqk[r,s] vnew_s    (qg = q * 2^b, from WY)
// Aqk carries scale and the decay (kkt stage). Inputs h [NT,HV,K,V] and vnew [TT,HV,V] float32;
// o in the dtype of its view. The same products as the fused copy in chunk_state.cu.
// Covered by tests/cuda/test_cuda_stages.cpp ("output").
#include "cuda/chunk_output.cuh"

#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128, kBV = kValueTile, kLdV = kBV + 8, kLdA = 68;

template <class Tin, int KD, bool kKDA>
struct OutputSmem {
  using QT = std::conditional_t<kKDA, float, Tin>;
  static constexpr int ldq = ld_row<QT>(KD);
  static constexpr size_t floats = KD * kLdV + kChunk * kLdA + kChunk * kLdV + 2 * kChunk;
  static constexpr size_t bytes = 4 * floats + (sizeof(QT) * kChunk * ldq + 15) / 16 * 16;
  float *Hs, *As, *VN, *gb, *rq;
  QT* Qs;
  __device__ explicit OutputSmem(float* b) {
    Hs = b, As = Hs + KD * kLdV, VN = As + kChunk * kLdA, gb = VN + kChunk * kLdV, rq = gb + kChunk;
    Qs = reinterpret_cast<QT*>(rq + kChunk);
  }
};

template <class Tin, int KD, bool kKDA>
__device__ void load_output_tiles(const OutputParams& op, const ChunkInfo& ck, int ci, int hv, int v0,
                                  const OutputSmem<Tin, KD, kKDA>& s) {
  using Sm = OutputSmem<Tin, KD, kKDA>;
  const ChunkParams& p = op.c;
  const int L = ck.len, h = hv / p.G;
  for (int idx = threadIdx.x; idx < kChunk * KD; idx += kThreads) {
    const int r = idx / KD, d = idx % KD;
    const int64_t tt = ck.t0 + r;
    if constexpr (kKDA) s.Qs[r * Sm::ldq + d] = r < L ? p.qg[(tt * p.HV + hv) * KD + d] : 0.0f;
    else s.Qs[r * Sm::ldq + d] = r < L ? static_cast<const Tin*>(p.q.p)[row_off(p.q, tt, h) + d] : Tin(0.0f);
  }
  for (int idx = threadIdx.x; idx < KD * kBV; idx += kThreads) {
    const int i = idx / kBV, j = idx % kBV;
    s.Hs[i * kLdV + j] = op.h[((int64_t(ci) * p.HV + hv) * KD + i) * p.V + v0 + j];
  }
  const float* a = p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) s.As[(idx / kChunk) * kLdA + idx % kChunk] = a[idx];
  for (int idx = threadIdx.x; idx < kChunk * kBV; idx += kThreads) {
    const int r = idx / kBV, j = idx % kBV;
    s.VN[r * kLdV + j] = r < L ? op.vnew[(int64_t(ck.t0 + r) * p.HV + hv) * p.V + v0 + j] : 0.0f;
  }
  for (int r = threadIdx.x; r < kChunk; r += kThreads) {
    const int64_t tt = ck.t0 + r;
    s.gb[r] = (!kKDA && r < L) ? p.gcum[tt * p.HV + hv] : 0.0f;
    s.rq[r] = (p.l2norm && r < L) ? p.rstd_q[tt * p.H + h] : 1.0f;
  }
}

template <class Tin, int KD, bool kKDA>
__global__ void __launch_bounds__(kThreads) chunk_output_kernel(const OutputParams op) {
  using Sm = OutputSmem<Tin, KD, kKDA>;
  constexpr bool S = kSplitProducts<Tin>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<float*>(smem_f4));
  const ChunkParams& p = op.c;
  const int ci = blockIdx.x, hv = blockIdx.y, v0 = kBV * blockIdx.z, mw = 16 * (threadIdx.x >> 5);
  const ChunkInfo ck = chunk_at(p, ci);
  load_output_tiles<Tin, KD, kKDA>(op, ck, ci, hv, v0, s);
  __syncthreads();
  float ao[kBV / 8][4] = {};
  for (int k0 = 0; k0 < KD; k0 += 8) {
    const FragA<S> fq = load_a_row<S>(s.Qs, Sm::ldq, mw, k0);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) mma(ao[nt], fq, load_b_kn<S>(s.Hs, kLdV, k0, 8 * nt));
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(mw, e);
    const float f = kKDA ? p.scale : p.scale * exp2f(s.gb[r]) * s.rq[r];
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) ao[nt][e] *= f;
  }
  for (int k0 = 0; k0 < kChunk; k0 += 8) {
    const FragA<S> fa = load_a_row<S>(s.As, kLdA, mw, k0);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) mma(ao[nt], fa, load_b_kn<S>(s.VN, kLdV, k0, 8 * nt));
  }
#pragma unroll
  for (int nt = 0; nt < kBV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(mw, e), j = acc_col(8 * nt, e);
      if (r < ck.len) store_any(op.o.p, op.o.dt, int64_t(ck.t0 + r) * op.o.st + int64_t(hv) * op.o.sx + v0 + j, ao[nt][e]);
    }
}

}  // namespace

void launch_chunk_output(const OutputParams& op, int input_dtype, cudaStream_t stream) {
  const ChunkParams& p = op.c;
  if (p.NT == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      dispatch_bool(p.kda, [&](auto kda) {
        constexpr bool kKDA = decltype(kda)::value;
        const size_t smem = OutputSmem<Tin, KD, kKDA>::bytes;
        launch_kernel(chunk_output_kernel<Tin, KD, kKDA>, dim3(p.NT, p.HV, p.V / kBV), kThreads, smem, stream, op);
      });
    });
  });
}

}  // namespace kcp::cuda
