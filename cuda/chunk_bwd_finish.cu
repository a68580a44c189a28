// Backward stages around the chunk kernels (the fused input transforms, ALGORITHMS.md 2.1-2.2, 3.3;
// CPU twins in reference/gates.h):
//   qk:     dqn = sum over the G value heads of q/k head h of dqv; with the norm
//           dq = rstd (dqn - (dqn . qn) qn), qn = q rstd, else dq = dqn (k likewise); one warp per row
//   gates:  one thread per gate element (gdn: per (token, value head)); the row's first also does
//           dbeta = dbeta_e, or dbeta_e * s sig (1 - sig) through the beta sigmoid;
//           dg = gate_backward(g + dt_bias, da): log decay da; softplus -da c softplus'(x) with
//           dA_log term da (-c softplus(x)); lower bound c dz, dz = da lb sig (1 - sig), dA_log
//           term dz z (c = exp(A_log) or 1, z = c x)
//   sums:   dA_log[hv] and ddt_bias[hv(*K + d)] summed over the tokens in two passes (partials per
//           block of ~256 tokens, then per output element), fixed partition and order: deterministic.
// With BwdParams::direct_qk (G = 1; kda / gla without the norm, gdn with or without it) kernel
// intra wrote dq, dk and qk does not run; with direct_dg (kda / gla) it wrote dg and gates only writes dbeta (one thread per row), or
// does not run (gla).
// Covered by tests/cuda/test_cuda_backward.cpp.
#include <algorithm>

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxK = kMaxKeyDim;  // the largest K the kernels are built for

__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ float block_sum(float x, float* red) {
  x = warp_sum(x);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) t += red[w];
  return t;
}

// dq (or dk) of one q/k row (token tt, head h), one warp: lane owns keys lane + 32 i (K <= kMaxK).
// The G value heads are summed in order j = 0, 1, ...; the norm's dot product over the warp. Split
// in two so that bwd_qk_kernel issues the loads of both rows (dqv / dkv of value head 0, the raw q /
// k bits, rstd) before any use: with the loads inside the sum over a runtime G and the conversion as
// each load's first use, the kernel waited out one round trip per element (ncu: 55% of its stall
// samples on long scoreboard, 2026-11-27).
struct FinishRow {
  static constexpr int kN = kMaxK / 32;
  float g[kN];
  uint32_t y[kN];  // raw bits of qn / kn (load_bits)
  float r;         // rstd of the row (fused norm)
};
__device__ void finish_row_load(FinishRow& f, const ChunkParams& p, const float* dxv, const QkRows& xn, int64_t tt, int h) {
  const int lane = int(threadIdx.x) & 31;
  const float* src = dxv + (tt * p.HV + int64_t(h) * p.G) * p.K;  // value head j: + j K
  const int64_t xo = row_off(xn.v, tt, h);
#pragma unroll
  for (int i = 0; i < FinishRow::kN; ++i) {
    const int d = lane + 32 * i;
    f.g[i] = d < p.K ? src[d] : 0.0f;
    f.y[i] = d < p.K && p.l2norm ? load_bits(xn.v.p, xn.v.dt, xo + d) : 0u;
  }
  f.r = p.l2norm ? xn.rstd[tt * p.H + h] : 1.0f;
  for (int j = 1; j < p.G; ++j)  // grouped value heads (rare): loads of one head at a time
#pragma unroll
    for (int i = 0; i < FinishRow::kN; ++i)
      if (lane + 32 * i < p.K) f.g[i] += src[int64_t(j) * p.K + lane + 32 * i];
}
__device__ void finish_row_store(FinishRow& f, const ChunkParams& p, const QkRows& xn, const OutRowsView& out, int64_t tt,
                                 int h) {
  const int lane = int(threadIdx.x) & 31;
  if (p.l2norm) {
    float y[FinishRow::kN], dot = 0.0f;
#pragma unroll
    for (int i = 0; i < FinishRow::kN; ++i) y[i] = bits_to_float(f.y[i], xn.v.dt) * f.r, dot = fmaf(f.g[i], y[i], dot);
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < FinishRow::kN; ++i) f.g[i] = f.r * (f.g[i] - dot * y[i]);
  }
  with_element_type(out.dt, [&](auto tag) {
    using To = typename decltype(tag)::type;
    To* o = static_cast<To*>(out.p) + tt * out.st + int64_t(h) * out.sx;
#pragma unroll
    for (int i = 0; i < FinishRow::kN; ++i)
      if (lane + 32 * i < p.K) o[lane + 32 * i] = from_float<To>(f.g[i]);
  });
}

// One warp per (token, head) row: dq and dk, every load of both rows issued first.
__global__ void __launch_bounds__(kThreads) bwd_qk_kernel(const BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= p.TT * p.H) return;  // whole warps
  const int64_t tt = row / p.H;
  const int h = int(row % p.H);
  FinishRow fq, fk;
  if (bp.dq.p) finish_row_load(fq, p, bp.dqv, q_rows(p), tt, h);
  if (bp.dk.p) finish_row_load(fk, p, bp.dkv, k_rows(p), tt, h);
  if (bp.dq.p) finish_row_store(fq, p, q_rows(p), bp.dq, tt, h);
  if (bp.dk.p) finish_row_store(fk, p, k_rows(p), bp.dk, tt, h);
}

// One thread per gate element (token, value head, d < Kg; Kg divides kThreads). gdn (Kg = 1): a
// block covers kThreads (token, value head) rows in memory order; kda: grid (token blocks, HV), a
// block covers kThreads / Kg tokens of one value head (the head from the block index, not from a
// 64-bit division per element). dbeta by the row's d = 0 thread. With direct_dg (kernel intra wrote
// dg) only dbeta is left: one thread per (token, value head) row, as gdn's.
__device__ __host__ inline bool gate_per_element(const BwdParams& bp) { return bp.c.kda && !bp.direct_dg; }
__global__ void __launch_bounds__(kThreads) bwd_gate_kernel(const BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int Kg = gate_per_element(bp) ? p.K : 1, d = int(threadIdx.x) % Kg;
  int64_t tt;
  int hv;
  if (gate_per_element(bp)) {
    tt = int64_t(blockIdx.x) * (kThreads / Kg) + int(threadIdx.x) / Kg, hv = int(blockIdx.y);
    if (tt >= p.TT) return;
  } else {
    const int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    if (r >= p.TT * p.HV) return;
    tt = r / p.HV, hv = int(r % p.HV);
  }
  const int64_t row = tt * p.HV + hv;
  if (d == 0 && bp.dbeta.p) {
    float db = bp.dbeta_e[row];
    if (p.beta_sigmoid) {
      const float s = sigmoid_f(load_any(p.beta.p, p.beta.dt, row_off(p.beta, tt, hv)));
      db *= p.beta_scale * s * (1.0f - s);
    }
    store_any(bp.dbeta.p, bp.dbeta.dt, row_off(bp.dbeta, tt, hv), db);
  }
  if (bp.direct_dg) return;
  const float rate = p.A_log.p ? expf(load_any(p.A_log.p, p.A_log.dt, hv * p.A_log.s)) : 1.0f;
  const int64_t e = row * Kg + d;
  const float da = bp.da[e];
  float dx = da, dal = 0.0f;
  if (p.gate != kGateLogDecay) {
    const float bias = p.dt_bias.p ? load_any(p.dt_bias.p, p.dt_bias.dt, (int64_t(hv) * Kg + d) * p.dt_bias.s) : 0.0f;
    const float x = load_any(p.g.p, p.g.dt, row_off(p.g, tt, hv) + d) + bias;
    if (p.gate == kGateSoftplus) {
      dal = da * (-rate * softplus_f(x));
      dx = -da * rate * (x > 20.0f ? 1.0f : sigmoid_f(x));
    } else {
      const float z = rate * x, s = sigmoid_f(z), dz = da * p.lower_bound * s * (1.0f - s);
      dal = p.A_log.p ? dz * z : 0.0f;
      dx = rate * dz;
    }
    bp.dx[e] = dx, bp.dalog[e] = dal;
  }
  if (bp.dg.p) store_any(bp.dg.p, bp.dg.dt, row_off(bp.dg, tt, hv) + d, dx);
}

// The parameter sums in two passes (deterministic: a fixed partition and fixed orders). Pass 1,
// block (p, hv): tokens [p nb, (p + 1) nb) of value head hv, thread (rr, d) = (tid / Kg, tid % Kg)
// summing rows rr, rr + R, ... (R = kThreads / Kg; the loads of a row coalesced): the dA_log terms
// over (tt, d) into part[hv P + p], the ddt_bias terms per d (its R row partials in order) into
// part[HV P + (hv Kg + d) P + p]. bp.part (TT HV kPartSlots floats) is free once the chunk sums ran.
// With one partition (P = 1, TT <= 256) the block's sums are the results: stored directly, no pass 2.
__global__ void __launch_bounds__(kThreads) bwd_param_part_kernel(const BwdParams bp, int64_t nb) {
  __shared__ float red[kThreads];
  const ChunkParams& p = bp.c;
  const int Kg = p.kda ? p.K : 1, R = kThreads / Kg, rr = int(threadIdx.x) / Kg, d = int(threadIdx.x) % Kg;
  const int hv = blockIdx.y, P = gridDim.x;
  const int64_t t0 = int64_t(blockIdx.x) * nb, t1 = min(t0 + nb, p.TT);
  float a = 0.0f, x = 0.0f;
  for (int64_t tt = t0 + rr; tt < t1; tt += R) {
    const int64_t e = (tt * p.HV + hv) * Kg + d;
    if (bp.dA_log.p) a += bp.dalog[e];
    if (bp.ddt_bias.p) x += bp.dx[e];
  }
  if (bp.dA_log.p) {
    a = block_sum(a, red);
    if (threadIdx.x == 0) {
      if (P == 1) store_any(bp.dA_log.p, bp.dA_log.dt, hv * bp.dA_log.s, a);
      else bp.part[int64_t(hv) * P + blockIdx.x] = a;
    }
  }
  if (bp.ddt_bias.p) {
    __syncthreads();  // block_sum's reads of red are done
    red[threadIdx.x] = x;
    __syncthreads();
    if (rr == 0) {
      for (int q = 1; q < R; ++q) x += red[q * Kg + d];
      if (P == 1) store_any(bp.ddt_bias.p, bp.ddt_bias.dt, (int64_t(hv) * Kg + d) * bp.ddt_bias.s, x);
      else bp.part[int64_t(p.HV) * P + (int64_t(hv) * Kg + d) * P + blockIdx.x] = x;
    }
  }
}

// Pass 2, block e: e < HV: dA_log[e] from part[e P ..]; else ddt_bias[e - HV] (= hv Kg + d) from its P
// partials; each in a fixed order.
__global__ void __launch_bounds__(kThreads) bwd_param_sum_kernel(const BwdParams bp, int P, int first) {
  __shared__ float red[kThreads / 32];
  const ChunkParams& p = bp.c;
  const int e = first + int(blockIdx.x);
  float acc = 0.0f;
  for (int i = threadIdx.x; i < P; i += kThreads) acc += bp.part[int64_t(e) * P + i];
  acc = block_sum(acc, red);
  if (threadIdx.x != 0) return;
  if (e < p.HV) store_any(bp.dA_log.p, bp.dA_log.dt, e * bp.dA_log.s, acc);
  else store_any(bp.ddt_bias.p, bp.ddt_bias.dt, int64_t(e - p.HV) * bp.ddt_bias.s, acc);
}

}  // namespace

void launch_bwd_finish(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.TT == 0) return;
  const int Kg = p.kda ? p.K : 1;
  KCP_CHECK(p.K <= kMaxK && kThreads % Kg == 0, "cuda-chunkwise backward: K = ", p.K, " (at most ", kMaxK,
            ", a divisor of ", kThreads, ")");
  const auto blocks = [](int64_t n, int per) { return dim3(unsigned((n + per - 1) / per)); };
  if ((bp.dq.p || bp.dk.p) && !bp.direct_qk) {  // direct_qk: kernel intra wrote them
    bwd_qk_kernel<<<blocks(p.TT * p.H, kThreads / 32), kThreads, 0, stream>>>(bp);
    KCP_CUDA_LAUNCH_CHECK();
  }
  const dim3 gate_grid = gate_per_element(bp) ? dim3(blocks(p.TT, kThreads / Kg).x, unsigned(p.HV)) : blocks(p.TT * p.HV, kThreads);
  if (!bp.direct_dg || bp.dbeta.p) {  // direct_dg: kernel intra wrote dg; what is left is dbeta
    bwd_gate_kernel<<<gate_grid, kThreads, 0, stream>>>(bp);
    KCP_CUDA_LAUNCH_CHECK();
  }
  if (p.gate == kGateLogDecay || !(bp.dA_log.p || bp.ddt_bias.p)) return;
  // about 256 tokens per pass-1 block (at most 1024 partitions), within bp.part: HV P (1 + Kg) floats
  const int P = int(std::min<int64_t>(1024, (p.TT + 255) / 256));
  const int64_t nb = (p.TT + P - 1) / P;
  KCP_CHECK(P == 1 || int64_t(p.HV) * P * (1 + Kg) <= p.TT * p.HV * kPartSlots,
            "cuda-chunkwise backward: parameter partials exceed the workspace");
  bwd_param_part_kernel<<<dim3(unsigned(P), unsigned(p.HV)), kThreads, 0, stream>>>(bp, nb);
  KCP_CUDA_LAUNCH_CHECK();
  if (P == 1) return;  // pass 1 stored the results
  const int first = bp.dA_log.p ? 0 : p.HV, last = bp.ddt_bias.p ? p.HV * (1 + Kg) : p.HV;
  bwd_param_sum_kernel<<<unsigned(last - first), kThreads, 0, stream>>>(bp, P, first);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace kcp::cuda
