// The fused gate pre-processing of one chunk, shared by the stages that form it:
//   beta_e[t]  = s * sigmoid(beta[t])  (s = 2 with allow_neg_eigval) or beta[t]; gla: 0
//   a[t,d]     = gate(g[t,d] + dt_bias[d]) or g[t,d]                 (device_math.cuh: gate_activate)
//   gcum[r,d]  = RCP_LN2 * sum_{s<=r} a[c*64+s, d]                    (restarts at every chunk)
// chunk_cumsum.cu runs gdn's scalar gate (one per row) as its own stage; kda and gla (a gate per key)
// form their [64, K] tile inside kkt, the first stage that reads it (scan_gate_tile: the raw gates
// are read once, in their dtype, instead of written as float32 by one stage and read back by the
// next). Sums are float32 and sequential down the rows, as FLA's chunk_local_cumsum's are float32.
// Covered by tests/cuda/test_cuda_stages.cpp (the gcum and beta written by stages cumsum and kkt).
#pragma once

#include "cuda/chunk_params.cuh"

namespace kcp::cuda {

template <class Tg>
__device__ __forceinline__ float gate_value(const ChunkParams& p, const Tg* g, int64_t i, float bias, float rate) {
  const float x = to_float(g[i]);
  return p.gate == kGateLogDecay ? x : gate_activate(p.gate, x + bias, rate, p.lower_bound);
}

__device__ __forceinline__ float dt_bias_of(const ChunkParams& p, int64_t i) {
  return (p.gate != kGateLogDecay && p.dt_bias.p) ? load_any(p.dt_bias.p, p.dt_bias.dt, i * p.dt_bias.s) : 0.0f;
}

// exp(A_log[hv]), the gate formula's rate (1 without A_log).
__device__ __forceinline__ float gate_rate(const ChunkParams& p, int hv) {
  return p.A_log.p ? expf(load_any(p.A_log.p, p.A_log.dt, hv * p.A_log.s)) : 1.0f;
}

// beta_e of flattened token tt (gla has no beta: 0).
__device__ __forceinline__ float effective_beta(const ChunkParams& p, int64_t tt, int hv) {
  if (p.gla) return 0.0f;
  const float b = load_any(p.beta.p, p.beta.dt, row_off(p.beta, tt, hv));
  return p.beta_sigmoid ? p.beta_scale * sigmoid_f(b) : b;
}

// Key d's column of the chunk's gate tile: its rows' raw gates loaded kBatch at a time (all in flight:
// one memory round trip per batch), then summed down the rows in a register, gs[r][d] = RCP_LN2 *
// (sum of rows <= min(r, L-1)): rows >= L repeat row L-1.
// With a gate formula the raw values go to gs first and a second loop activates them 8 rows at a
// time and sums them.
template <class Tg, int kBatch>
__device__ void scan_column(const ChunkParams& p, const ChunkInfo& ck, int hv, int d, float* gs, int ldg) {
  const Tg* g = static_cast<const Tg*>(p.g.p) + row_off(p.g, ck.t0, hv) + d;
  const int L = ck.len;
  const bool formula = p.gate != kGateLogDecay;
  float acc = 0.0f;
#pragma unroll 1
  for (int r0 = 0; r0 < kChunk; r0 += kBatch) {
    Tg x[kBatch];
    // Every load unconditional at a clamped row (rows >= L load row L-1, never summed). A pointer
    // stepped only while r < L (call 4) let the compiler prove the rows past L equal to the last
    // one and copy it instead: each copy then waited on the previous load, 64 round trips in a row.
#pragma unroll
    for (int j = 0; j < kBatch; ++j) x[j] = g[int64_t(min(r0 + j, L - 1)) * p.g.st];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!formula && r0 + j < L) acc += to_float(x[j]);
      gs[(r0 + j) * ldg + d] = formula ? to_float(x[j]) : kRcpLn2 * acc;
    }
  }
  if (!formula) return;
  const float bias = dt_bias_of(p, int64_t(hv) * p.K + d), rate = gate_rate(p, hv);
  // 8 rows' formulas at a time, independent of each other and of the sum, so their exp / log
  // latencies overlap: one row at a time, the formula's latency stood 64 times in front of kkt's
  // products (kda's fused fwd+bwd +0.11 ms at T = 8192 against the cumsum stage, twenty-first
  // session, call 1); 8 copies of the formula code, not 64.
#pragma unroll 1
  for (int r0 = 0; r0 < kChunk; r0 += 8) {
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = gate_activate(p.gate, gs[(r0 + j) * ldg + d] + bias, rate, p.lower_bound);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (r0 + j < L) acc += a[j];
      gs[(r0 + j) * ldg + d] = kRcpLn2 * acc;
    }
  }
}

// kda / gla: the chunk's gate cumsum into gs [64][ldg] (float32, log2 units), rows >= L repeating row
// L-1 (so the stages' exp2 of differences stay finite): one thread per key (kThreads >= KD; the rest
// wait), its column's loads in flight together and its sum in a register (a sequential float32 sum,
// as the cumsum stage's), so the tile costs one memory round trip (two for float32 gates, whose 64
// registers spilled in gla's kkt) and one barrier, where a scan through shared memory with its
// barriers had cost kda's kkt 0.182 -> 0.224 ms (T = 8192). Every thread of the block must call it;
// it ends with the barrier. kBatch: rows loaded at once (a register each).
template <int KD, int kThreads, int kBatch = kChunk>
__device__ void scan_gate_tile(const ChunkParams& p, const ChunkInfo& ck, int hv, float* gs, int ldg) {
  static_assert(kThreads >= KD, "scan_gate_tile: one thread per key");
  const int d = int(threadIdx.x);
  if (d < KD) {
    switch (p.g.dt) {
      case kBF16: scan_column<__nv_bfloat16, kBatch>(p, ck, hv, d, gs, ldg); break;
      case kF16: scan_column<__half, kBatch>(p, ck, hv, d, gs, ldg); break;
      case kF64: scan_column<double, 16>(p, ck, hv, d, gs, ldg); break;  // 64 doubles would not fit in registers
      default: scan_column<float, kBatch / 2>(p, ck, hv, d, gs, ldg); break;
    }
  }
  __syncthreads();
}

// Rows of the scanned tile into the workspace gcum [TT,HV,KD]: every row < L, or only row L-1 (the
// chunk's b_end: all that gla's forward chain reads, ChunkParams::forward_only).
template <int KD, int kThreads>
__device__ void store_gate_tile(const ChunkParams& p, const ChunkInfo& ck, int hv, const float* gs, int ldg) {
  const int r0 = p.forward_only ? ck.len - 1 : 0;
  for (int idx = threadIdx.x; idx < (ck.len - r0) * (KD / 4); idx += kThreads) {
    const int r = r0 + idx / (KD / 4), d = 4 * (idx % (KD / 4));
    *reinterpret_cast<float4*>(p.gcum + (int64_t(ck.t0 + r) * p.HV + hv) * KD + d) =
        *reinterpret_cast<const float4*>(gs + r * ldg + d);
  }
}

}  // namespace kcp::cuda
