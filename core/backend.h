// The one interface every algorithm implements (cpu-recurrent, cpu-chunkwise, cuda-chunkwise) and
// the only thing the CP layer and the harness see (ggml's backend table + FlashAttention's params).
//
//   queue():   the execution context (core/queue.h): the device every view passed in must live on,
//              its memory, copies, timing and the small device operations the CP layer needs
//   forward:   o = op(inputs), final_state per sequence (FLA semantics, problem.h)
//   backward:  gradients of L = sum(o * d_o) + sum(final_state * d_final_state) w.r.t. every input
//              as passed (raw gate, raw beta, un-normalized q/k when the flags fuse them)
//   transition_forward(seq_begin, packed): the affine maps of the sequences seq_begin ..
//              seq_begin+count-1 (count = packed.dim(0)), state_out = M state_in + S_ext, where S_ext is
//              the final state from a zero initial state and M [K,K] (initial_state is ignored);
//              written into packed [count, HV, K, V+K] (core/transition.h: S_ext beside M)
//   transition_backward(seq_begin, packed): the transposed chains, dS_in = M^T dS_out + dS_ext, where
//              dS_ext is dL/dS_in of each sequence's outputs with d_final_state = 0; packed holds
//              (dS_ext, M^T), or dS_ext alone when packed is [count, HV, K, V] (core/transition.h:
//              the M^T chain is not run)
//   conv1d_forward / conv1d_backward: the causal depthwise conv1d of the layer (core/conv1d.h)
//   explain_forward(p): one line on how forward(p) would run, for `kcp bench --explain` (a backend
//              that plans, such as the segmented one of segment/, prints its plan); empty by default
// Transition buffers are always in the K-major math layout, whatever flags.state_v_first says, in
// the compute precision, contiguous, on the backend's device.
// Covered by tests/reference/test_identities.cpp, tests/chunkwise/test_transition.cpp and the
// per-backend suites (tests/cuda/).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <string>
#include <string_view>

#include "core/conv1d.h"
#include "core/problem.h"
#include "core/queue.h"

namespace kcp {

struct Support {
  bool ok = true;
  std::string reason;  // why not, when !ok ("chunk_size 48: cpu-chunkwise supports 16, 32, 64")
  explicit operator bool() const { return ok; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Support supports(const Problem& p) const = 0;
  // Whether backward and transition_backward run for p (a forward-only backend says why not here,
  // so callers such as `kcp check` can judge its outputs and skip the gradients).
  virtual Support supports_backward(const Problem& p) const { return supports(p); }

  virtual void forward(const Problem& p, const Inputs& in, const Outputs& out) = 0;
  // Optional: runs ahead the stages of a forward(p, in, ...) that do not depend on in.initial_state
  // (which a CP rank receives from earlier ranks), so that they overlap its wait; a forward that
  // follows on the same inputs may then skip them. Results are the same with or without it.
  // Default: nothing (cuda-chunkwise with keep_forward: chunkwise_keep.cu).
  virtual void forward_prepare(const Problem& p, const Inputs& in) { (void)p, (void)in; }
  virtual void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) = 0;
  // Optional: runs ahead the stages of a backward(p, in, {d_o, ...}) that depend on the inputs and d_o
  // alone, not on d_final_state (which a CP rank receives from later ranks), so that they overlap its
  // wait; a backward that follows on the same inputs and d_o may then skip them. Results are the same
  // with or without it. Default: nothing (cuda-chunkwise with a kept forward: chunkwise_keep.cu).
  virtual void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) { (void)p, (void)in, (void)d_o; }
  // Optional: while on, the caller vouches that each call finds, in every view that the backend's
  // previous call also took, the contents that call saw (nothing wrote them in between). The CP layer
  // turns it on around a rank's local pass that follows its transition or prepare on the same views,
  // and off right after, also when the call throws (cp/context_parallel.cpp); a backend that checks
  // contents before reusing work (cuda-chunkwise's input fingerprints) may then skip that check, and
  // still compares problem, dtypes and shapes. Default: nothing.
  virtual void set_inputs_unchanged(bool on) { (void)on; }
  virtual void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) = 0;
  virtual void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                                   const TensorView& packed) = 0;
  virtual Support supports_conv1d(const Conv1dProblem&) const { return {}; }
  virtual void conv1d_forward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& y) = 0;
  virtual void conv1d_backward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& dy,
                               const Conv1dGrads& g) = 0;

  // `kcp bench --explain`: the plan a forward of p follows (segments, calls), decided before it runs;
  // and how the last forward ran (the kernels a backend picked, e.g. cuda-chunkwise's state kernel and
  // windows; after a transition_forward, its state kernel), known after. Empty where a backend has
  // nothing to say.
  virtual std::string explain_forward(const Problem&) const { return {}; }
  virtual std::string explain_last_forward() const { return {}; }

  // The execution context: every view passed in must live on queue().device(); work is ordered on it.
  virtual Queue& queue() const = 0;
  virtual Device device() const { return queue().device(); }  // a device backend may answer without its queue
  void synchronize() const { queue().synchronize(); }
};

// Throws kcp::Error naming the backend and the reason when `b` cannot run `p`.
void require_support(const Backend& b, const Problem& p);
// The same for the backward (supports_backward()).
void require_backward_support(const Backend& b, const Problem& p);

}  // namespace kcp
