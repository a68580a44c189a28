// The transition of a run of tokens (ALGORITHMS.md 5.2): per value head, the affine map from the state
// entering the run to the state leaving it, state_out = M state_in + S_ext, M [K,K], S_ext [K,V]; the
// backward uses the same algebra on (M^T, dS_ext). Packed as FLA's hm / dhm buffer, one element per
// sequence, segment or rank:
//   packed [count, HV, K, V+K]: columns [0,V) hold S (S_ext or dS_ext), columns [V,V+K) hold M (or M^T)
// so that one all-gather moves a rank's element and one buffer holds the transitions of many sequences.
// compose(later, earlier) = (M_l M_e, M_l S_e + S_l) is associative with identity (I, 0); a reset
// (M = 0) marks a run that starts a sequence. The operations on packed buffers are Queue methods
// (core/queue.h) so they run where the buffer lives; this header has the layout helpers.
// Covered by tests/core/test_transition.cpp (host algebra) and tests/cuda/test_cuda_transition.cpp (device).
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace kcp {

// [count, HV, K, V+K]
inline Shape transition_shape(int64_t count, int64_t HV, int64_t K, int64_t V) { return {count, HV, K, V + K}; }

// Element i of a packed buffer as [HV, K, V+K]; its S part [HV,K,V] and M part [HV,K,K] (strided views).
TensorView transition_element(const TensorView& packed, int64_t i);
TensorView transition_s(const TensorView& element);
TensorView transition_m(const TensorView& element);

// The S part alone, [count, HV, K, V]: what a transition_backward call may ask for where the caller
// has M^T already (the CP layer transposes the forward's M) or does not need it (a run that stops
// there with no d_final_state): the M^T chain is then not run.
inline Shape transition_s_shape(int64_t count, int64_t HV, int64_t K, int64_t V) { return {count, HV, K, V}; }
// Whether `packed` holds the S part alone (its last axis is V, not V + K).
inline bool transition_s_only(const Problem& p, const TensorView& packed) {
  return packed.rank() == 4 && packed.dim(3) == p.V;
}

// Throws unless `packed` is a contiguous [count, HV, K, V+K] buffer (or, with allow_s_only, [count,
// HV, K, V]) of p's sizes in p.compute on `device`.
void check_transition_buffer(const Problem& p, const TensorView& packed, int64_t count, Device device,
                             const char* what, bool allow_s_only = false);
// The arguments of a transition_forward / transition_backward call: `packed` is a [count,HV,K,V+K]
// buffer as above (transition_backward: or the S part alone, allow_s_only) for the sequences
// [seq_begin, seq_begin + count) of p. Returns count.
int64_t check_transition_call(const Problem& p, int64_t seq_begin, const TensorView& packed, Device device,
                              const char* what, bool allow_s_only = false);

// The state entry n of a [N,HV,K,V] (or, v_first, [N,HV,V,K]) view, seen K-major as [HV,K,V]
// (a stride permutation, no copy): what the transition algebra reads and writes.
TensorView state_entry_kmajor(const TensorView& states, int64_t n, bool v_first);

}  // namespace kcp
