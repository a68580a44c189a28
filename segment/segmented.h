// The segmented forward: intra-card context parallelism (ALGORITHMS.md 5.8, docs/CP.md "Intra-card
// CP"), the CP algorithm of cp/ with segments for ranks and no communicator. Given a plan
// (segment/plan.h) that cuts some sequences into chunk-aligned segments, on the backend's queue:
//   1. the segments become packed sub-sequences (plan.cu over the B*T tokens, B = 1);
//   2. ONE Backend::transition_forward gives (S_ext, M) of the segments [transition_first, +count)
//      into a packed [count, HV, K, V+K] buffer (compute precision, K-major);
//   3. the first segment of each cut sequence n starts from h0[n]: transition_start(e, h0[n])
//      (S = M h0 + S_ext, M = 0); without h0 it starts from 0 and needs nothing;
//   4. one Queue::transition_scan over the cut sequences (one range each, all but the last segment):
//      the state after segment j is the initial state of segment j+1, exact (M is never truncated);
//   5. one Backend::forward over all segments from those initial states (the first segment of each
//      sequence from h0[n] or 0) writes o in place; final_state[n] is the last segment's final state.
// No host round trip: every step is enqueued on the queue. The initial states of the segments are
// held in the compute precision, in the layout flags.state_v_first asks for.
// The backward, the same cut mirrored (ALGORITHMS.md 5.4), all on the queue:
//   1. the segments as packed sub-sequences, as above;
//   2. the initial state of every segment, as the forward's steps 2-4 computed it (recomputed: a
//      backward call does not rely on an earlier forward);
//   3. ONE Backend::transition_backward gives (dS_ext, M^T) of the segments [transition_first + 1,
//      +count) (every cut sequence's segments but its first); per cut sequence they are copied last
//      segment first into one range, dht[n] is folded into that range's first element
//      (transition_start), and one scan gives, after each element, the gradient at the start of its
//      segment: the d_final_state of the segment before it;
//   4. one Backend::backward over all segments from those initial states and d_final_states writes
//      dq, dk, dv, dg, dbeta in place; d_initial_state[n] is the first segment's (the gradients at the
//      other segments' starts are internal); dA_log / ddt_bias come from that one call (it sums over
//      all tokens).
// Covered by tests/segment/test_segmented.cpp (host backends) and tests/cuda/test_cuda_segmented.cpp.
#pragma once

#include <array>

#include "core/backend.h"
#include "segment/plan.h"

namespace kcp::seg {

// Device buffers kept between calls (grown, never shrunk), so that a forward allocates nothing in
// the steady state (cudaMalloc and cudaFree would synchronize the device).
class SegmentWorkspace {
 public:
  enum Slot { elems, rev, states, h0, ht, dh0, kSlots };
  // A contiguous view of `shape` in slot s, on q's device; the contents are undefined.
  TensorView get(Queue& q, Slot s, DType dt, const Shape& shape);

 private:
  std::array<DeviceBuffer, kSlots> bufs_;
};

// forward(p, in, out) through `plan` (from plan_segments(p, ...)); an unsplit plan calls
// be.forward(p, in, out) as it is. With a split plan and B > 1, q, k, v, g, beta and o must have
// mergeable batch and time (stride[0] == T * stride[1]); throws naming the tensor otherwise.
void segmented_forward(Backend& be, const Problem& p, const Inputs& in, const Outputs& out, const SegmentPlan& plan,
                       SegmentWorkspace& ws);

// backward(p, in, d, gr) through `plan` (the forward's plan for p); an unsplit plan calls be.backward as
// it is. With a split plan and B > 1, d_o and the token gradients must have mergeable batch and time too.
void segmented_backward(Backend& be, const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr,
                        const SegmentPlan& plan, SegmentWorkspace& ws);
// Whether the views allow the batch-to-packed reshape a split plan needs (always for B = 1).
bool batch_mergeable(const Problem& p, const Inputs& in, const Outputs& out);
bool batch_mergeable(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr);

}  // namespace kcp::seg
