// The chunkwise forward on the GPU as a host-callable pipeline (no CUDA headers here, so backends
// and tests in plain C++ can use it). Stages, in order (ALGORITHMS.md 4):
//   cumsum (chunk_cumsum.cu) -> kkt + solve (chunk_kkt.cu) -> WY (chunk_wy.cu)
//   -> state recurrence with the output fused in (chunk_state.cu)
// except for gdn with 16-bit inputs, whose state kernel folds the WY products in
// (chunk_state_fold.cu): cumsum -> kkt + solve -> state + output (w and u never stored).
// run_stage() runs one stage on its own, reading earlier results from buffers() (which a test may
// overwrite with the CPU twin's values first) so that a failure names one kernel; the state stage
// then also writes h and vnew, and the separate output stage (chunk_output.cu) reads them.
// All views must live on the CUDA device: q, k, v in one of float32/float16/bfloat16 with a
// contiguous last dimension, 16-byte aligned rows, and batch/time mergeable (stride[0] = T*stride[1]);
// g, beta, A_log, dt_bias, states and o in any float dtype.
// Covered by tests/cuda/test_cuda_stages.cpp, test_cuda_forward.cpp, test_cuda_transition.cpp.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "core/queue.h"
#include "cuda/fold_layout.h"

namespace kcp::cuda {

// kkt_w: kkt writing w as well (gdn with 16-bit inputs: the kept forward's and the recompute's front,
// where no u is wanted and the WY stage does not run).
enum class Stage { cumsum, kkt, kkt_w, wy, state, output };

// Float32 device buffers of the stage results (TT = B*T tokens, NT = chunks of all sequences).
struct StageBuffers {
  TensorView gcum;            // [TT,HV,Kg] chunk-local cumsum of the log decay, log2 units (Kg = K kda, 1 gdn)
  TensorView beta;            // [TT,HV] effective beta
  TensorView rstd_q, rstd_k;  // [TT,H] 1/sqrt(|x|^2 + 1e-6) (l2norm only, else empty)
  TensorView P, Aqk;          // [NT,HV,64,64] (I + Lmat)^-1 and the masked, scaled q k^T with decay
  TensorView Gk;              // [NT,HV,64,64] kda: the gated gram of kn, strict lower, rows < L (kkt; the
                              // backward's WY kernel reads it instead of forming it again); else empty
  TensorView w;               // [TT,HV,K]
  TensorView u;               // [TT,HV,V]
  TensorView kg, qg;          // [TT,HV,K] (kda only, else empty; kg not in a forward with the transposed chain)
  TensorView kgt;             // [NT,HV,K,64] kg transposed per chunk (kda's forward with the transposed chain)
  TensorView kg_decay;        // [NT,HV,K] 2^(b_end) per chunk and key for that chain (chunk_state_kda.cuh)
  TensorView h;               // [NT,HV,K,V] state entering each chunk
  TensorView vnew;            // [TT,HV,V]
};

// Float32 device buffers of the backward (cuda/chunk_bwd.cuh), valid after backward().
struct BackwardBuffers {
  TensorView dh;              // [NT,HV,K,V] gradient of the state leaving each chunk
  TensorView dvnew;           // [TT,HV,V]
  TensorView dqv, dkv;        // [TT,HV,K] dq, dk per value head (before the group sum and L2 norm)
  TensorView dbeta_e;         // [TT,HV] w.r.t. the effective beta
  TensorView da;              // [TT,HV,Kg] w.r.t. the per-token log decay a
  TensorView dx, dalog;       // [TT,HV,Kg] fused gate: w.r.t. g + dt_bias, and the dA_log terms
  TensorView dAc, Wc;         // [NT,HV,64,64] the chunk stage's dAqk, and dvnew vnew^T then dL
  TensorView part;            // [TT,HV,8] the chunk stage's partial sums (chunk_bwd.cuh)
};

// How the last forward (plain or kept) ran, for `kcp bench --explain` (Backend::explain_last_forward)
// and the tests: the state stage's kernel, the transposed kda chain's blocks, its windows, and what a
// kept forward stored or reused. Recorded where the launches are chosen, so it names what ran.
struct ForwardSchedule {
  // chunk_state_fold (gdn, 16-bit inputs), chunk_state_kda (kda's transposed chain), chunk_state
  // (w and u from WY), chunk_state_gla, chunk_state_gla_halves; empty before any forward
  const char* state = "";
  int64_t chain_blocks = 0;   // chunk_state_kda's blocks (V / 64 per sequence and value head); else 0
  FoldLayout fold{0, 0};      // chunk_state_fold's block layout (fold_layout.h); groups 0: another kernel
  int windows = 0;            // kda: windows of window_chunks chunks (chunkwise_windows.cu); 0: none
  int window_chunks = 0;
  bool chain_per_window = false;  // windows: a chain launch per window (else the chain in one launch)
  bool kept = false;          // keep_forward: h and vnew stored for a backward
  bool front_reused = false;  // the kept front stages of a transition or prepare were used
  // e.g. "state chunk_state_kda (32 blocks), 8 windows of 64 chunks (kkt, WY beside the chain, the chain in
  // one launch)", "state chunk_state_fold (2 warpgroups x 32 columns), kept"
  std::string describe() const;
};

class Pipeline {
 public:
  // Runs on `queue`'s CUDA device and stream (cuda/queue_cuda.h); the queue must outlive the pipeline.
  explicit Pipeline(Queue& queue);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // o (in the dtype of out.o) and, when requested, final_state. Asynchronous on the queue's stream.
  void forward(const Problem& p, const Inputs& in, const Outputs& out);

  // Sizes the stage buffers for p (including h and vnew) and returns them.
  const StageBuffers& prepare_stages(const Problem& p, const Inputs& in);
  // One stage; `state` writes h, vnew, out.final_state (when given) and, when out.o is given, the
  // fused output; `output` (the separate output kernel) writes out.o. `wy` is the stage that the
  // folded path (gdn, 16-bit inputs) skips; it still serves the others and transition_forward.
  void run_stage(Stage s, const Problem& p, const Inputs& in, const Outputs& out);

  // Keep the forward's intermediates for the backward (issue 11's "recompute or keep"; default off):
  // forward() then also writes what the backward's recompute would (the WY w, h and vnew, beside the
  // gate cumsum, P, Aqk, kg, qg it always writes), at the recompute's cost instead of the forward's,
  // and fingerprints its inputs (beside its state chain, on a second stream of the device); a
  // backward() that is the next call on this pipeline, for the same problem and inputs of the same
  // dtypes, shapes and contents, skips the recompute; otherwise it recomputes. The backward's
  // fingerprint also runs beside its chain, and the host waits for it after the last launch: where
  // the contents differ (inputs changed in place), the backward runs again with the recompute before
  // returning (kept_redos). No memory beyond the workspace the backward allocates anyway. Covered by
  // tests/cuda/test_cuda_keep.cpp.
  void set_keep_forward(bool on);

  // kda's plain forward with 16-bit inputs runs its state chain transposed (chunk_state_kda.cu: 64
  // value columns per block, the state in wgmma accumulators) where the shape allows it, and so do the
  // kept forward and the backward's recompute where the chain's blocks also fill the multiprocessors:
  // 1 (default, also KCP_CUDA_KDA_CHAIN unset or 1) or 0 (chunk_state.cu's chain, KCP_CUDA_KDA_CHAIN=0).
  // Covered by tests/cuda/test_cuda_kda_chain.cpp and test_cuda_keep.cpp.
  void set_kda_chain(bool on);
  // Whether the last forward (plain or kept) or transition_forward ran the transposed kda chain (for tests).
  bool kda_chain_used() const;
  // How the last forward (or transition_forward: its state kernel) ran (ForwardSchedule);
  // kda_chain_used and kda_windows_used read it.
  const ForwardSchedule& last_forward() const;
  // kda's forward with the transposed chain in windows of chunks: each window's kkt and WY run beside
  // the chain, whose blocks leave most multiprocessors idle (chunkwise_windows.cu: the chain in one
  // launch waiting on the fronts' signals where its blocks are at most a quarter of the multiprocessors,
  // else a chain launch per window). -1: automatic (default; also KCP_CUDA_KDA_WINDOW unset or "auto"):
  // where the chain's blocks fill at most half of the multiprocessors, from 64 chunks with the chain in
  // one launch, from 128 with a launch per window (the sizes: window_plan); 0: never (KCP_CUDA_KDA_WINDOW=0 or off); > 0: windows of that many chunks wherever the
  // transposed chain runs (the kept forward's too, where it takes that chain). The result is the
  // unwindowed forward's bit for bit. Covered by tests/cuda/test_cuda_kda_chain.cpp and test_cuda_keep.cpp.
  void set_kda_window(int chunks);
  // The windows the last forward ran (0: none), for tests.
  int kda_windows_used() const;
  // Backwards on this pipeline that skipped the recompute (a kept forward's workspace used), for tests.
  int64_t kept_reuses() const;
  // With keep_forward (else nothing): the kept forward's front stages (gate cumsum, kkt + solve, WY),
  // which do not read the initial state, for a forward on the same inputs (Backend::forward_prepare).
  // A transition_forward of all sequences with keep_forward leaves its front stages the same way.
  void forward_prepare(const Problem& p, const Inputs& in);
  // Kept forwards that skipped their front stages (left by forward_prepare or transition_forward), for tests.
  int64_t kept_front_reuses() const;
  // With a kept forward on these inputs (else nothing): dhu_local's terms for d_o (Backend::backward_prepare).
  void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o);
  // Backwards and transition_backwards that skipped dhu_local: a backward_prepare or a
  // transition_backward of all sequences on the kept forward left its terms for the same do (the
  // CP layer's order), for tests.
  int64_t kept_term_reuses() const;
  // Backwards that read a kept record whose inputs then fingerprinted otherwise, and ran again with the
  // recompute, for tests.
  int64_t kept_redos() const;
  // While on (Backend::set_inputs_unchanged: the caller vouches that every call finds in the views
  // the previous call also took the contents that call saw), the reuse of a kept record, of its
  // dhu_local terms or of kept front stages compares problem, dtypes and shapes, not fingerprints:
  // no hash, no host synchronization. Default off.
  void set_inputs_unchanged(bool on);
  // Folded state kernel (gdn, 16-bit inputs): 16-column groups per warpgroup, 1 or 2, and warpgroups
  // per block sharing the loaded tiles (1 x 1, 2 x 1 or 2 x 2); groups 0 (the default) picks by the
  // device's multiprocessor count (fold_layout.h automatic_fold_layout). For tests, which must
  // cover every layout.
  void set_state_groups(int groups, int warpgroups = 1);
  // The multiprocessor count that the grid-shape choices (16 or 32 state columns per block in the
  // state and dhu chains) assume; 0 (the default): the device's. For tests: 1 picks the widest blocks
  // wherever they divide (32 columns; the folded state kernel's 64 of 2 x 2), so small cases cover
  // the wide blocks too.
  void set_multiprocessors(int sms);
  // gla's state stage of one sequence with 16-bit inputs (forward, kept forward, the backward's
  // recompute) walks its chain as two halves at once
  // (chunk_state_gla_halves.cu): -1 (the default) where each half has at least 32 chunks and the
  // doubled chain still has a multiprocessor per block (few heads), 0 never, 1 wherever it applies
  // (tests: small cases). KCP_CUDA_GLA_HALVES sets the same (diagnostics) when this is -1.
  void set_gla_halves(int mode);
  // Per-chunk kernels compute their chunk's table entry where the layout has a closed form (equal
  // sequence lengths: chunk_params.cuh chunk_at) instead of reading the table; off: they read it.
  // Default on; KCP_CUDA_CHUNK_GRID=0 turns it off (A/B). For tests (the same results either way).
  void set_chunk_grid(bool on);
  // Whether the last call's kernels computed their table entries (set_chunk_grid on and the layout in
  // closed form), for tests.
  bool chunk_grid_used() const;

  // Gradients of L = sum(o * d_o) + sum(final_state * d_final_state) w.r.t. the inputs as passed
  // (Backend::backward): recomputes the forward's stages (buffers() then holds them, h and vnew
  // included), then runs the backward kernels (chunk_bwd.cuh). Asynchronous on the queue's stream.
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr);
  const BackwardBuffers& backward_buffers() const;
  const StageBuffers& buffers() const;
  // (dS_ext, M^T) of the sequences seq_begin .. seq_begin+count-1 (Backend::transition_backward):
  // packed [count, HV, K, V+K] float32 on the device.
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                           const TensorView& packed);

  // (S_ext, M) of the sequences seq_begin .. seq_begin+count-1 in one pass over their chunks:
  // packed [count, HV, K, V+K] float32 on the device (core/transition.h).
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kcp::cuda
