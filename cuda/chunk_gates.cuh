// The fused gate pre-processing of one chunk, shared by the stages that form it:
//   beta_e[t]  = s * sigmoid(beta[t])  (s = 2 with allow_neg_eigval) or beta[t]; gla: 0
//   a[t,d]     = gate(g[t,d] + dt_bias[d]) or g[t,d]                 (device_math.cuh: gate_activate)
//   gcum[r,d]  = RCP_LN2 * sum_{s<=r} a[c*64+s, d]                    (restarts at every chunk)
// chunk_cumsum.cu runs gdn's scalar gate (one per row) as its own stage; kda and gla (a gate per key)
// form their [64, K] tile inside kkt, the first stage that reads it (scan_gate_tile: the raw gates
// are read once, in their dtype, instead of written as float32 by one stage and read back by the
// next). Sums are float32 and sequential down the rows (or down each half of them, scan_gate_tile),
// as FLA's chunk_local_cumsum's are float32.
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

// Key d's column of the chunk's gate tile, rows [row0, row0 + kRows): their raw gates loaded kBatch
// at a time (all in flight: one memory round trip per batch), then summed down the rows in a
// register, gs[r][d] = unit * (sum of rows row0 .. min(r, L-1)): rows >= L repeat row L-1.
// With a gate formula the raw values go to gs first and a second loop activates them 8 rows at a
// time and sums them.
template <class Tg, int kBatch, int kRows = kChunk>
__device__ void scan_column(const ChunkParams& p, const ChunkInfo& ck, int hv, int d, float* gs, int ldg, int row0 = 0,
                            float unit = kRcpLn2) {
  static_assert(kRows % kBatch == 0 && kRows % 8 == 0, "scan_column: whole batches");
  const Tg* g = static_cast<const Tg*>(p.g.p) + row_off(p.g, ck.t0, hv) + d;
  const int L = ck.len;
  const bool formula = p.gate != kGateLogDecay;
  float acc = 0.0f;
#pragma unroll 1
  for (int r0 = row0; r0 < row0 + kRows; r0 += kBatch) {
    Tg x[kBatch];
    // Every load unconditional at a clamped row (rows >= L load row L-1, never summed). A pointer
    // stepped only while r < L (call 4) let the compiler prove the rows past L equal to the last
    // one and copy it instead: each copy then waited on the previous load, 64 round trips in a row.
#pragma unroll
    for (int j = 0; j < kBatch; ++j) x[j] = g[int64_t(min(r0 + j, L - 1)) * p.g.st];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!formula && r0 + j < L) acc += to_float(x[j]);
      gs[(r0 + j) * ldg + d] = formula ? to_float(x[j]) : unit * acc;
    }
  }
  if (!formula) return;
  const float bias = dt_bias_of(p, int64_t(hv) * p.K + d), rate = gate_rate(p, hv);
  // 8 rows' formulas at a time, independent of each other and of the sum, so their exp / log
  // latencies overlap: one row at a time, the formula's latency stood 64 times in front of kkt's
  // products (kda's fused fwd+bwd +0.11 ms at T = 8192 against the cumsum stage, twenty-first
  // session, call 1); 8 copies of the formula code, not 64.
#pragma unroll 1
  for (int r0 = row0; r0 < row0 + kRows; r0 += 8) {
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = gate_activate(p.gate, gs[(r0 + j) * ldg + d] + bias, rate, p.lower_bound);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (r0 + j < L) acc += a[j];
      gs[(r0 + j) * ldg + d] = unit * acc;
    }
  }
}

// One column scan per key, in the gates' dtype (float32 gates: half batches, whose 64 registers
// spilled in gla's kkt; float64: 16 rows at a time).
template <int kRows, int kBatch>
__device__ void scan_column_any(const ChunkParams& p, const ChunkInfo& ck, int hv, int d, float* gs, int ldg, int row0,
                                float unit) {
  constexpr int b16 = kBatch < kRows ? kBatch : kRows, b32 = b16 < kBatch / 2 ? b16 : kBatch / 2;
  switch (p.g.dt) {
    case kBF16: scan_column<__nv_bfloat16, b16, kRows>(p, ck, hv, d, gs, ldg, row0, unit); break;
    case kF16: scan_column<__half, b16, kRows>(p, ck, hv, d, gs, ldg, row0, unit); break;
    case kF64: scan_column<double, 16, kRows>(p, ck, hv, d, gs, ldg, row0, unit); break;
    default: scan_column<float, b32, kRows>(p, ck, hv, d, gs, ldg, row0, unit); break;
  }
}

// kda / gla: the chunk's gate cumsum into gs [64][ldg] (float32, log2 units), rows >= L repeating row
// L-1 (so the stages' exp2 of differences stay finite): one thread per key (kThreads >= KD; the rest
// wait), its column's loads in flight together and its sum in a register (a sequential float32 sum,
// as the cumsum stage's), so the tile costs one memory round trip (two for float32 gates) and one
// barrier, where a scan through shared memory with its barriers had cost kda's kkt 0.182 -> 0.224 ms
// (T = 8192). With two threads per key (kThreads >= 2 KD: gla's kkt, kda's at K <= 64) each takes
// half of the rows at once, rows 32..63 summed from 0 and offset by row 31's value after a barrier:
// one round trip of 32 loads instead of two, and the other warps no longer wait idle (gla kkt at
// T = 32768: the scan was 21% of the instructions and its barrier 22% of the stall samples, ncu).
// Every thread of the block must call it; it ends with the barrier. kBatch: rows loaded at once.
template <int KD, int kThreads, int kBatch = kChunk>
__device__ void scan_gate_tile(const ChunkParams& p, const ChunkInfo& ck, int hv, float* gs, int ldg) {
  static_assert(kThreads >= KD, "scan_gate_tile: one thread per key");
  const int d = int(threadIdx.x) % KD, half = int(threadIdx.x) / KD;
  if constexpr (kThreads >= 2 * KD) {
    constexpr int kHalf = kChunk / 2;
    if (half < 2) scan_column_any<kHalf, kBatch>(p, ck, hv, d, gs, ldg, kHalf * half, half ? 1.0f : kRcpLn2);
    __syncthreads();
    if (half == 1) {  // the local sums of rows 32..63 (natural log units) after row 31's value
      const float base = gs[(kHalf - 1) * ldg + d];
      for (int r = kHalf; r < kChunk; ++r) gs[r * ldg + d] = fmaf(kRcpLn2, gs[r * ldg + d], base);
    }
  } else if (half == 0) {
    scan_column_any<kChunk, kBatch>(p, ck, hv, d, gs, ldg, 0, kRcpLn2);
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
