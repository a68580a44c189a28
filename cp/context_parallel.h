// Context-parallel forward and backward of one gdn / kda / gla call over any Backend and a Comm on
// the backend's memory (ALGORITHMS.md 5.3-5.7): the one CP algorithm, whatever the device (host MPI,
// device buffers over staged MPI or NCCL; cp/comm_device.h). Each rank holds its part [lo, hi) of the
// packed token stream.
//   forward:  (S_ext, M) of the last local sequence when it continues (started from h0 when it starts
//             here: S = M h0 + S_ext, M = 0), one exchange, merge into the first local sequence's
//             initial state (oldest rank first), then the local forward. Only that merged state is kept
//             for the backward (FLA's compress_h0).
//   backward: (dS_ext, M^T) of the first local sequence when it continues (from dht when it ends
//             here), one exchange, merge into the last local sequence's incoming gradient (farthest
//             rank first), then the local backward; dA_log and ddt_bias are all-reduced.
// Exchange + merge: FLA's all-gather of [HV,K,V+K] and linear fold, or a log-depth scan (merge.h).
// All transition and state arithmetic runs on the backend's queue (core/queue.h), in the compute
// precision; nothing is copied through the host except under the staged MPI communicator.
// Tensors (on the backend's device): q,k,v,g,beta,o and their gradients are this rank's part
// [1, hi-lo, ...]; A_log, dt_bias and their gradients are whole (gradients identical on every rank);
// states are global [N,HV,K,V] on every rank: initial_state / d_final_state are read for the
// sequences that start / end here, final_state / d_initial_state are written for the sequences that
// end / start here, zero elsewhere (summing them over ranks gives the single-process tensors). Every
// call first checks over the control communicator, with one all-gather of a hash, that all ranks
// agree on the configuration, and rejects it on every rank.
// Covered by the cp-sweep (tests/cp/CMakeLists.txt runs it at 1-4 ranks; scripts/gpu.sh on the GPU)
// and tests/cp/test_cp_mpi.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "cp/comm.h"
#include "cp/context.h"
#include "cp/merge.h"

namespace kcp::cp {

enum class MergeAlgorithm { linear, log_depth };
std::string_view merge_name(MergeAlgorithm m);
MergeAlgorithm merge_parse(std::string_view name);

struct CpOptions {
  ProblemOptions problem;       // scale, chunk_size, compute, check_finite; cu_seqlens: GLOBAL (required)
  std::vector<int64_t> bounds;  // part boundaries R[0..P]; empty: equal parts (context.h)
  MergeAlgorithm merge = MergeAlgorithm::linear;
  bool timing = false;          // cp-bench: time each phase on the queue (synchronizes between phases) and put
                                // a barrier before the exchange, so `wait` holds the load imbalance and
                                // `exchange` the communication alone
};

// Milliseconds of the last call's phases on this rank (cp-bench; zero unless CpOptions::timing).
struct CpPhaseTimes {
  double check = 0, transition = 0, wait = 0, exchange = 0, merge = 0, local = 0, reduce = 0;
  double total() const { return check + transition + wait + exchange + merge + local + reduce; }
};

class ContextParallel {
 public:
  // Builds the context from opt.problem.cu_seqlens and opt.bounds; no communication yet. `comm`
  // must work on the backend's device (comm.device() == backend.device()).
  ContextParallel(Comm& comm, Backend& backend, Variant variant, const Flags& flags, CpOptions opt);

  const CpContext& context() const { return ctx_; }
  void forward(const Inputs& in, const Outputs& out);
  // Needs the forward of the same inputs first (it keeps the merged initial state).
  void backward(const Inputs& in, const Cotangents& d, const Grads& gr);
  const CpPhaseTimes& forward_times() const { return fwd_times_; }
  const CpPhaseTimes& backward_times() const { return bwd_times_; }

 private:
  struct Local;  // the validated local problem of one call
  Local prepare(const Inputs& in, std::string& config) const;
  void forward_impl(const Local& lp, const Inputs& in, const Outputs& out);
  void backward_impl(const Local& lp, const Inputs& in, const Cotangents& d, const Grads& gr);
  void backward_transition(const Problem& p, const Inputs& loc, const Cotangents& d, const TensorView& mine);
  void exchange_and_merge(const TensorView& mine, bool backward, const TensorView& merged, CpPhaseTimes& times);
  TensorView local_initial_states(const Local& lp, const Inputs& in);  // in ws_.h0
  void reduce_parameter_grads(const Local& lp, const TensorView& dA, const TensorView& ddt, const Grads& gr);
  template <class F> void phase(double& ms, F f);

  Comm& comm_;
  Backend& backend_;
  Variant variant_;
  Flags flags_;
  CpOptions opt_;
  CpContext ctx_;
  DeviceTensor saved_h0_;  // compress_h0: the merged [HV,K,V] of local sequence 0 (empty when not needed)
  DeviceTensor saved_m_;   // M [HV,K,K] of the forward transition where this rank holds one sequence;
  bool have_m_ = false;    // whether this forward wrote it (the buffer is kept across calls, as the Workspace's)
  // Buffers of one call kept for the next (DeviceTensor::reuse: reallocated when a shape changes): on a
  // GPU each allocation and free per call is a cudaMalloc / cudaFree, and cudaFree waits for the device.
  struct Workspace {
    DeviceTensor mine;       // this rank's transition element [1,HV,K,V+K], forward then backward
    MergeBuffers merge;      // merge_linear's all-gather [P,HV,K,V+K], merge_log_depth's scan elements
    DeviceTensor ds;         // dS_ext alone [1,HV,K,V] (backward_transition)
    DeviceTensor merged;     // the backward's merged d_final_state of the last local sequence [HV,K,V]
    DeviceTensor h0, ht;     // the local call's initial and final states [N_local,HV,..]
    DeviceTensor dht, dh0;   // and their gradients
    DeviceTensor dA, ddt;    // the parameter gradients' local sums before the all-reduce
  } ws_;
  bool have_forward_ = false;
  CpPhaseTimes fwd_times_, bwd_times_;
};

}  // namespace kcp::cp
