// The parameter block every chunk kernel receives by value (FlashAttention's params-struct style):
// sizes, the chunk table, raw input pointers with element strides, flags of the fused
// pre-processing, and the float32 workspace that carries each stage's result to the next.
//   Tokens are flattened: token tt = b*T + t (B = 1 with cu_seqlens), so a [B,T,X,D] view with
//   stride[0] == T*stride[1] is addressed as tt*st + x*sx + d (d contiguous).
//   Workspace shapes (TT = B*T, NT = chunks of all sequences, Kg = K for kda, 1 for gdn):
//     gcum [TT,HV,Kg] chunk-local cumsum of the log decay in log2 units; beta_e [TT,HV];
//     rstd_q, rstd_k [TT,H] (l2norm only); P, Aqk [NT,HV,64,64]; w, kg, qg [TT,HV,K]; u [TT,HV,V]
//     (gla: no P, w, u).
// Covered by tests/cuda/test_cuda_stages.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/chunk_table.h"
#include "cuda/device_math.cuh"

namespace kcp::cuda {

// kda / gla: a 16-row block takes its pairs through anchored factors (one 2^x per row and key
// instead of one per pair) when the key's gate spread over the block's rows is at most this, in log2
// units: the factors then stay within 2^-64 .. 2^64; wider blocks take exact per-pair exponents.
// kkt's diagonal blocks, wy's build_diag and intra's in-block pairs share the rule; gla's kkt and
// backward intra apply it to the whole chunk for their one anchor per chunk (chunk_anchor_holds).
constexpr float kMaxAnchorSpread = 64.0f;

// The one-anchor rule's block-wide verdict (a barrier; every thread of the block calls it): each
// thread checks keys [d, d + N) of a gate tile gs [64][ldg] at rows r0, r0 + step, .. < L against be
// (those keys' row L - 1): all within kMaxAnchorSpread, none NaN. The first row alone would do for
// gates of one sign (the cumsum is monotone), but gates may change sign: an excursion inside the
// chunk would overflow qa or flush kg to zero where the pair's own factor is moderate.
// N = 4: one 16-byte load per row (gla's kkt, chunk_kkt_gla.cuh); N = 1: chunk_bwd_intra_gla.cu.
template <int N>
__device__ __forceinline__ bool chunk_anchor_holds(const float* gs, int ldg, int L, int d, int r0, int step,
                                                   const float (&be)[N]) {
  static_assert(N == 1 || N == 4, "chunk_anchor_holds: one key or four");
  float m = 0.0f;
  bool nan = false;
  for (int r = r0; r < L; r += step) {
    float x[N];
    if constexpr (N == 4) {
      const float4 b = *reinterpret_cast<const float4*>(gs + r * ldg + d);
      x[0] = b.x - be[0], x[1] = b.y - be[1], x[2] = b.z - be[2], x[3] = b.w - be[3];
    } else {
      x[0] = gs[r * ldg + d] - be[0];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) m = fmaxf(m, fabsf(x[j])), nan |= x[j] != x[j];
  }
  return !__syncthreads_or(nan || !(m <= kMaxAnchorSpread));
}

struct RowsView {  // read-only [B,T,X,D] or [B,T,X]
  const void* p = nullptr;
  int64_t st = 0, sx = 0;
  int dt = kF32;
};
// 16-byte groups of E elements of a [B,T,X,D] view: usable when the base, both strides and the
// column offset keep every group 16-byte aligned.
__host__ __device__ __forceinline__ bool rows_vec16(const RowsView& v, int E) {
  return (reinterpret_cast<uintptr_t>(v.p) & 15) == 0 && v.st % E == 0 && v.sx % E == 0;
}
struct OutRowsView {  // writable [B,T,X,D]
  void* p = nullptr;
  int64_t st = 0, sx = 0;
  int dt = kF32;
};
struct StateView {  // [N,HV,K,V] addressed as (n, hv, i = key row, j = value column)
  void* p = nullptr;
  int64_t sn = 0, shv = 0, si = 0, sj = 0;
  int dt = kF32;
};
struct ScalarView {  // [X] (A_log, dt_bias)
  const void* p = nullptr;
  int64_t s = 0;
  int dt = kF32;
};

struct ChunkParams {
  int B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, N = 0, G = 1, NT = 0;
  int sms = 0;  // multiprocessors of the device the pipeline runs on (grid-shape heuristics)
  int64_t TT = 0;
  float scale = 1;
  bool kda = false;  // per-channel gate (kda and gla)
  // gla: kda's stages with the delta rule taken out (beta_e = 0, so Lmat = 0, P = I, w = 0, u = v):
  // kkt's gla instantiation (template flag kDelta = false) writes Aqk, kg, qg (no k k^T, no solve: P
  // is not allocated), WY does not run (no w, u), and chunk_state_gla.cu runs the state recurrence
  // S = Gamma_end S + kg^T v split over key rows, then o = scale qg h[c] + Aqk v from the stored
  // states, GLA's chunked form (ALGORITHMS.md 3).
  bool gla = false;
  // fused pre-processing (ALGORITHMS.md 2.1-2.2)
  bool l2norm = false, beta_sigmoid = false;
  float beta_scale = 1;  // 2 with allow_neg_eigval
  int gate = kGateLogDecay;
  float lower_bound = 0;
  ScalarView A_log, dt_bias;
  // chunk table
  const ChunkInfo* chunks = nullptr;  // [NT]
  const int* seq_chunk0 = nullptr;    // [N+1] first chunk of each sequence
  ChunkGrid grid;                     // the table in closed form (chunk_at), where the layout has one
  // inputs
  RowsView q, k, v, g, beta;
  // workspace
  float* gcum = nullptr;
  // gla's forward without keep (nothing after it reads the front's workspace): kkt writes only each
  // chunk's last gcum row (b_end), all that the state chain reads of it.
  bool forward_only = false;
  float* beta_e = nullptr;
  float* rstd_q = nullptr;
  float* rstd_k = nullptr;
  float* P = nullptr;
  float* Aqk = nullptr;
  float* Gk = nullptr;  // kda: kkt writes the gated gram G (Lmat = Diag(beta) G) for the backward's WY kernel
  float* w = nullptr;
  // gdn with 16-bit inputs, where w is wanted without u (the kept forward, the backward's recompute):
  // kkt writes w = P (beta k Gamma) from the P and k tiles it holds, and the WY stage does not run.
  // Set by launch_chunk_kkt(..., with_w) alone.
  bool kkt_writes_w = false;
  float* u = nullptr;
  float* kg = nullptr;
  // kda's plain forward with the transposed chain (chunk_state_kda.cu): kg per chunk transposed,
  // [NT,HV,K,64] (columns >= L zero), which the WY stage writes instead of kg.
  float* kg_t = nullptr;
  float* kg_decay = nullptr;  // with kg_t: 2^(b_end) per chunk and key, [NT,HV,K] (kda_decay_pos order)
  float* qg = nullptr;
  // The kkt and WY stages over the chunks [c_off, c_off + c_num) only (c_num = 0: through NT): the
  // windowed kda forward (chunkwise_windows.cu) runs them a window at a time beside the chain of the
  // one before.
  int c_off = 0, c_num = 0;
};
// The chunks a front-stage launch covers (its grid's chunk dimension; block x of it is chunk c_off + x).
inline int front_chunks(const ChunkParams& p) { return p.c_num > 0 ? p.c_num : p.NT - p.c_off; }

// Chunk ci's entry: computed where the layout is uniform (grid.len > 0), else read from the table. A
// per-chunk block needs it before it can address its tiles, and the table read is a dependent global
// load at the block's start: 28% of gla's output stage's stall samples waited on it (ncu, T = 32768,
// twenty-fourth session). The host builds grid only after checking it against every table entry
// (chunk_table.h closed_form).
__device__ __forceinline__ ChunkInfo chunk_at(const ChunkParams& p, int ci) {
  return p.grid.len > 0 ? grid_entry(p.grid, ci) : p.chunks[ci];
}

// The multiprocessor count the grid-shape choices assume: the pipeline's (its device's, or the
// tests' set_multiprocessors), or 132 (H100 SXM) where a caller left it 0.
inline int multiprocessors(const ChunkParams& p) { return p.sms > 0 ? p.sms : 132; }

// The state recurrence (and, fused, the output) over the chunks of each sequence.
// kInitTransition (delta variants: chunk_state, the folded kernel, and the backward's dhu with V for
// Vu): columns [0, Vu) start from 0 and take u (S_ext), columns [Vu, Vw) start from the identity
// I[row][col - Vu] with u = 0 (M): one launch for both.
enum StateInit : int { kInitZero = 0, kInitGiven = 1, kInitIdentity = 2, kInitTransition = 3 };
struct StateParams {
  ChunkParams c;
  int Vw = 0;                    // state columns: V (forward, S_ext), K (transition M) or V + K (both)
  int Vu = 0;                    // columns of u and its row width (0: Vw); with kInitTransition, V
  const float* u = nullptr;      // [TT,HV,Vu]; null means u = 0 (the M recurrence; gla's chain reads v instead)
  int init = kInitZero;
  StateView h0;                  // read when init == kInitGiven
  StateView final_state;         // written when p != null
  float* h = nullptr;            // [NT,HV,K,Vw] state entering each chunk (stage tests, the kept forward)
  // gla's plain forward (no keep: the output is h's only reader): the chain stores h TF32-rounded (16-bit
  // inputs, not in halves) and the output uses its tiles as loaded. Never for a kept h: kernel hv's gate
  // term 2^b_end rowsum(h dh) reads h unrounded.
  bool h_tf32 = false;
  float* vnew = nullptr;         // [TT,HV,Vw] (stage tests, the kept forward)
  OutRowsView o;                 // fused output when p != null
  // gla's forward of one sequence with its chain walked as two halves at once (chunk_state_gla_halves.cu):
  // mid > 0 is the second half's first chunk. The first half starts from h0 (or 0) and ends in s_mid, the
  // second starts from 0 and ends in f_local (both [HV,K,V] float32); h of the second half's chunks is
  // then its own (h_local) until corrected to h_local + D_c s_mid, D_c = decay[c] ([NT+1,HV,K] float32:
  // the product of 2^(b_end) over chunks mid .. c-1; row NT for the final state): by the output in
  // shared memory (written back to h where mid_store_h), or, without an output, in h itself.
  int mid = 0;
  bool mid_store_h = false;
  float* s_mid = nullptr;
  float* f_local = nullptr;
  float* decay = nullptr;
  // kda's transposed chain over the chunk window [win_begin, win_end) only (win_end = 0: every chunk):
  // a sequence whose chunks begin before the window starts from `carry` instead of h0 (or 0), one that
  // goes on after it stores its state to `carry` instead of final_state; a sequence with no chunk is
  // served by the window holding its position (the last one for position NT). chunkwise_windows.cu's
  // windowed forward (plain or kept); carry [N,HV,K,V] float32.
  int win_begin = 0, win_end = 0;
  StateView carry;
  // kda's transposed chain in one launch beside the windows' fronts (chunkwise_windows.cu): chunk c's
  // tiles are ready once ready[c] holds `epoch` in its high word (its window's end in the low word),
  // set by the fronts' signal after that window's WY. Null: every tile is ready at launch.
  const unsigned long long* ready = nullptr;
  unsigned epoch = 0;
};

// Output stage on its own (stage tests): o from q, h, vnew, Aqk.
struct OutputParams {
  ChunkParams c;
  const float* h = nullptr;     // [NT,HV,K,V]
  const float* vnew = nullptr;  // [TT,HV,V]
  OutRowsView o;
};

__device__ __forceinline__ int64_t row_off(const RowsView& v, int64_t tt, int x) { return tt * v.st + int64_t(x) * v.sx; }

// The tokens of a sequence's chunks [c_begin, c_begin + count) of the table: consecutive 64-token runs
// from t_first, the last ending at t_end, so a kernel walking the sequence reads two table entries, not
// one per chunk. Chunk i (from 0): tokens [t0(i), t0(i) + len(i)).
struct SeqTokens {
  int t_first = 0, t_end = 0;
  __device__ int t0(int i) const { return t_first + kChunk * i; }
  __device__ int len(int i) const { return min(kChunk, t_end - t0(i)); }
  __device__ int last(int i) const { return min(t0(i) + kChunk, t_end) - 1; }  // its last token
};
__device__ __forceinline__ SeqTokens seq_tokens(const ChunkParams& p, int c_begin, int count) {
  SeqTokens s;
  if (count > 0) {
    const ChunkInfo a = chunk_at(p, c_begin), b = chunk_at(p, c_begin + count - 1);
    s.t_first = a.t0, s.t_end = b.t0 + b.len;
  }
  return s;
}

// f(std::true_type{}) for a full chunk (L == kChunk: every chunk of a sequence but its last), else
// f(std::false_type{}): the copies inside f take copy_rows_async's kFull form (tile_mma.cuh) where they can (no row
// test, no zero-fill address select), with L tested once for all of them.
template <class F>
__device__ __forceinline__ void with_full_chunk(int L, F&& f) {
  if (L == kChunk) f(std::true_type{});
  else f(std::false_type{});
}

// The work of a state chain's block on the grid (Vw / BV, N * HV): the value columns [v0, v0 + BV) of
// sequence n and value head hv, over its chunks [c_begin, c_end).
struct ChainBlock {
  int v0, n, hv, c_begin, c_end;
};
__device__ __forceinline__ ChainBlock chain_block(const ChunkParams& p, int BV) {
  const int n = blockIdx.y / p.HV;
  return {int(blockIdx.x) * BV, n, int(blockIdx.y % p.HV), p.seq_chunk0[n], p.seq_chunk0[n + 1]};
}
// Swizzled tiles (wgmma.cuh sw128_offset) need their 1024-byte atoms aligned: dynamic shared memory
// starts there on Hopper; a block whose does not stops rather than compute from misplaced rows.
__device__ __forceinline__ void expect_swizzle_aligned(const void* smem) {
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) % 1024 != 0) __trap();
}

// u's row width, and whether the state columns from v0 take u (false: the M columns, u = 0).
__host__ __device__ __forceinline__ int u_width(const StateParams& sp) { return sp.Vu > 0 ? sp.Vu : sp.Vw; }
__device__ __forceinline__ bool takes_u(const StateParams& sp, int v0) { return sp.u != nullptr && v0 < u_width(sp); }

}  // namespace kcp::cuda
