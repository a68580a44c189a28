// Judging FLA's per-rank CP transitions, as a capture stores them (docs/DUMP_FORMAT.md section 5,
// docs/CP.md "FLA's own CP judged by kcp"), against the oracle's transition of the same tokens.
//   /debug/cp_transition_fwd [HV, K, V+K] float32 = (S_ext | M): FLA's hm of
//       chunk_gated_delta_rule_fwd_h_pre_process (fla/ops/cp/chunk_delta_h.py), the affine map of the
//       rank's LAST local sequence from the rank's first token (or the sequence's start, when it starts
//       on this rank) to the rank's end: S_ext = its final state from a zero state, M [K,K] = the
//       product of its per-token state maps (latest on the left), state_out = M state_in + S_ext.
//       FLA computes it only when that sequence continues on the next rank (context.is_last_rank
//       false); otherwise it gathers zeros that no rank reads.
//   /debug/cp_transition_bwd [HV, K, V+K] float32 = (dS_ext | M^T): FLA's dhm of
//       chunk_gated_delta_rule_bwd_dhu_pre_process, over the rank's FIRST local sequence: dS_ext =
//       dL/dS at its first token for L = sum(o * do) over its tokens on this rank (dht = 0), M^T the
//       transpose of that range's M. Computed only when the sequence started on an earlier rank
//       (context.is_first_rank false); otherwise zeros.
// Both are K-major whatever the state layout (FLA's ag_hm is always [K, V+K]). The oracle is the
// host backend's transition_forward / transition_backward (validation/cases.h sequence_transition) of
// the same local sequence, with this rank's own inputs and do (every token of the range is in the file).
// Where FLA computes nothing and stored zeros, the rows are skipped with that reason; anything else
// stored is judged (zeros where FLA should have computed fail, unless the oracle's map is ~0 too).
// Covered by tests/validation/test_cp_transition.cpp (library and kcp check).
#pragma once

#include <string>
#include <vector>

#include "core/backend.h"
#include "io/dump.h"
#include "validation/policy.h"

namespace kcp::val {

struct TransitionPair {
  std::string tensor;        // "cp_transition_fwd.S", ".M", "cp_transition_bwd.dS", ".MT"; group "debug"
  Tensor<double> candidate;  // the dump's part
  Tensor<double> oracle;
  DType stored = DType::f32;
  Bar bar;
  std::string skip;          // non-empty: not judged, and why
  std::string problem;       // non-empty: cannot be compared (shape, placement), counts as a failure
};

inline constexpr const char* kTransitionGroup = "debug";
inline constexpr const char* kTransitionFwd = "cp_transition_fwd";
inline constexpr const char* kTransitionBwd = "cp_transition_bwd";
// The row names (tensor column), forward then backward.
inline constexpr const char* kTransitionRows[4] = {"cp_transition_fwd.S", "cp_transition_fwd.M",
                                                   "cp_transition_bwd.dS", "cp_transition_bwd.MT"};

// Whether the dump stores either transition.
bool has_cp_transitions(const io::Dump& d);

// The rows for both stored transitions of a chunkwise CP rank file; `host` must be a host backend,
// `compute` its precision (the oracle: cpu-recurrent in float64).
std::vector<TransitionPair> cp_transition_pairs(Backend& host, const io::Dump& d, DType compute);

// The bar of a transition part: FLA's test_chunk bars (tolerance.h), ht's for S_ext, M and M^T, dh0's
// for dS_ext; float64 in and out: two exact algorithms.
Bar transition_bar(bool state_gradient, DType stored, DType input);

}  // namespace kcp::val
