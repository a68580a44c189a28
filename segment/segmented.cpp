// segmented_forward and segmented_backward (see segmented.h): the steps of its header, each a Backend
// or Queue call.
#include "segment/segmented.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/transition.h"

namespace kcp::seg {
namespace {

bool mergeable(const TensorView& t) { return t.empty() || t.dim(0) == 1 || t.stride[0] == t.dim(1) * t.stride[1]; }

// [B,T,...] seen as [1,B*T,...] (the packed layout of the segments).
TensorView packed_tokens(const TensorView& t, const char* name) {
  if (t.empty() || t.dim(0) == 1) return t;
  KCP_CHECK(mergeable(t), name, ": segmenting a batch needs mergeable batch and time (stride[0] == T*stride[1]), got "
            "strides ", shape_str(t.stride));
  TensorView r = t;
  r.shape[1] = t.dim(0) * t.dim(1), r.shape[0] = 1;
  r.stride[0] = r.shape[1] * t.stride[1];
  return r;
}

// States [N,HV,K,V] (or [N,HV,V,K] with v_first) seen K-major as [N,HV,K,V]: a stride permutation.
TensorView kmajor(const TensorView& states, bool v_first) {
  TensorView r = states;
  if (v_first) std::swap(r.shape[2], r.shape[3]), std::swap(r.stride[2], r.stride[3]);
  return r;
}

// dst[d] = src[s] for each pair, one copy_view per run of pairs where both indices step by one.
void copy_entries(Queue& q, const TensorView& dst, const TensorView& src, const std::vector<std::pair<int64_t, int64_t>>& ds) {
  for (size_t i = 0; i < ds.size();) {
    size_t j = i + 1;
    while (j < ds.size() && ds[j].first == ds[j - 1].first + 1 && ds[j].second == ds[j - 1].second + 1) ++j;
    const int64_t len = int64_t(j - i);
    q.copy_view(dst.narrow(0, ds[i].first, len), src.narrow(0, ds[i].second, len));
    i = j;
  }
}

}  // namespace

TensorView SegmentWorkspace::get(Queue& q, Slot s, DType dt, const Shape& shape) {
  const size_t bytes = std::max<size_t>(16, size_t(shape_numel(shape)) * size_t(dtype_size(dt)));
  if (bufs_[s].bytes() < bytes) bufs_[s] = DeviceBuffer(q, bytes);
  return TensorView(bufs_[s].get(), dt, shape, q.device());
}

bool batch_mergeable(const Problem& p, const Inputs& in, const Outputs& out) {
  if (p.B == 1) return true;
  for (const TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta, &out.o})
    if (!mergeable(*t)) return false;
  return true;
}

bool batch_mergeable(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) {
  if (p.B == 1) return true;
  for (const TensorView* t : {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta})
    if (!mergeable(*t)) return false;
  return batch_mergeable(p, in, Outputs{d.d_o, {}});  // the inputs, and d_o in o's place
}

namespace {

void check_plan_fits(const Problem& p, const SegmentPlan& plan) {
  bool fits = int64_t(plan.seq_seg.size()) == p.N + 1;
  for (int64_t n = 0; fits && n < p.N; ++n) {
    const SeqRange r = p.sequence(n);
    const int64_t s0 = plan.seq_seg[size_t(n)], s1 = plan.seq_seg[size_t(n) + 1];
    fits = s0 < s1 && s1 < int64_t(plan.cu.size()) && plan.cu[size_t(s0)] == r.b * p.T + r.t0 &&
           plan.cu[size_t(s1)] == r.b * p.T + r.t0 + r.len;
  }
  KCP_CHECK(fits, "segmented forward: the plan was made for another problem (its segments do not tile the ", p.N,
            " sequences of ", p.describe(), ")");
}

// Steps 2-4 of segmented.h: the initial state of every segment of `ps` (the segment problem) into
// h0s [Nseg, HV, K, V] ([Nseg, HV, V, K] with state_v_first); `h0` is the call's initial_state.
void segment_initial_states(Backend& be, const Problem& ps, const Inputs& is, const TensorView& h0,
                            const SegmentPlan& plan, SegmentWorkspace& ws, const TensorView& h0s) {
  Queue& q = be.queue();
  const bool vf = ps.flags.state_v_first;
  const int64_t N = int64_t(plan.seq_seg.size()) - 1, first = plan.transition_first, E = plan.transition_count;
  const TensorView elems = ws.get(q, SegmentWorkspace::elems, ps.compute, transition_shape(E, ps.HV, ps.K, ps.V));
  if (E > 0) be.transition_forward(ps, is, first, elems);  // [E, HV, K, V+K]: (S_ext | M) per segment
  std::vector<TransitionRange> ranges;                     // one per cut sequence: all but its last segment
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s0 = plan.seq_seg[size_t(n)], s1 = plan.seq_seg[size_t(n) + 1];
    if (s1 - s0 < 2) continue;
    ranges.push_back({s0 - first, s1 - s0 - 1});
    if (!h0.empty())  // the reset (0, M h0 + S_ext)
      q.transition_start(transition_element(elems, s0 - first), state_entry_kmajor(h0, n, vf));
  }
  const TensorView states = ws.get(q, SegmentWorkspace::states, ps.compute, {E, ps.HV, ps.K, ps.V});  // [E,HV,K,V]
  q.transition_scan(elems, ranges, states);
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (first segment of n, n)
  for (int64_t n = 0; n < N; ++n) pairs.push_back({plan.seq_seg[size_t(n)], n});
  if (h0.empty()) q.fill_zero(h0s);
  else copy_entries(q, h0s, h0, pairs);
  for (const TransitionRange& r : ranges)  // the state after element j starts segment first + j + 1
    q.copy_view(kmajor(h0s, vf).narrow(0, first + r.first + 1, r.count), states.narrow(0, r.first, r.count));
}

// Backward step 3 (segmented.h): the d_final_state of every segment of `ps` into dhts [Nseg, HV, K, V]
// ([Nseg, HV, V, K] with state_v_first): the last segment of sequence n takes dht[n] (or 0), segment
// j of a cut sequence the gradient at the start of segment j + 1, folded from the sequence's end:
// (dS_ext, M^T) of the segments [transition_first + 1, +count) (every cut sequence's segments but its
// first), copied last segment first into one range per sequence, dht folded into the first element
// of the range (transition_start), one scan.
void segment_final_grads(Backend& be, const Problem& ps, const Inputs& is, const TensorView& d_o, const TensorView& dht,
                         const SegmentPlan& plan, SegmentWorkspace& ws, const TensorView& dhts) {
  Queue& q = be.queue();
  const bool vf = ps.flags.state_v_first;
  const int64_t N = int64_t(plan.seq_seg.size()) - 1, first = plan.transition_first + 1, E = plan.transition_count;
  const Shape et = transition_shape(E, ps.HV, ps.K, ps.V);
  const TensorView elems = ws.get(q, SegmentWorkspace::elems, ps.compute, et);
  const TensorView rev = ws.get(q, SegmentWorkspace::rev, ps.compute, et);
  if (E > 0) be.transition_backward(ps, is, d_o, first, elems);
  q.fill_zero(dhts);
  std::vector<TransitionRange> ranges;
  std::vector<std::pair<int64_t, int64_t>> last;   // (last segment of n, n)
  std::vector<std::pair<int64_t, int64_t>> inner;  // (segment, scan entry whose state ends it)
  for (int64_t n = 0, k = 0; n < N; ++n) {
    const int64_t s0 = plan.seq_seg[size_t(n)], s1 = plan.seq_seg[size_t(n) + 1], cnt = s1 - s0 - 1;
    last.push_back({s1 - 1, n});
    if (cnt < 1) continue;
    for (int64_t i = 0; i < cnt; ++i) {  // rev[k + i] = the element of segment s1 - 1 - i; the state
      // after it is the gradient at that segment's start: the end of segment s1 - 2 - i
      q.copy_view(transition_element(rev, k + i), transition_element(elems, s1 - 1 - i - first));
      inner.push_back({s1 - 2 - i, k + i});
    }
    if (!dht.empty()) q.transition_start(transition_element(rev, k), state_entry_kmajor(dht, n, vf));
    ranges.push_back({k, cnt});
    k += cnt;
  }
  if (!dht.empty()) copy_entries(q, dhts, dht, last);
  const TensorView states = ws.get(q, SegmentWorkspace::states, ps.compute, {E, ps.HV, ps.K, ps.V});
  q.transition_scan(rev, ranges, states);
  copy_entries(q, kmajor(dhts, vf), states, inner);
}

// Step 1 of both directions: the problem of the segments as packed sequences, and the inputs seen so.
Problem segment_problem(const Problem& p, const SegmentPlan& plan) {
  Problem ps = p;
  ps.B = 1, ps.T = p.B * p.T, ps.N = plan.segments(), ps.cu_seqlens = plan.cu;
  return ps;
}
Inputs segment_inputs(const Inputs& in) {
  Inputs is = in;
  is.q = packed_tokens(in.q, "q"), is.k = packed_tokens(in.k, "k"), is.v = packed_tokens(in.v, "v");
  is.g = packed_tokens(in.g, "g"), is.beta = packed_tokens(in.beta, "beta"), is.initial_state = {};
  return is;
}
Shape segment_states_shape(const Problem& p, const Problem& ps) {
  return p.flags.state_v_first ? Shape{ps.N, p.HV, p.V, p.K} : Shape{ps.N, p.HV, p.K, p.V};
}

}  // namespace

void segmented_forward(Backend& be, const Problem& p, const Inputs& in, const Outputs& out, const SegmentPlan& plan,
                       SegmentWorkspace& ws) {
  if (!plan.split) return be.forward(p, in, out);
  check_plan_fits(p, plan);
  Queue& q = be.queue();
  // 1. the segments as packed sequences
  const Problem ps = segment_problem(p, plan);
  Inputs is = segment_inputs(in);
  const TensorView o = packed_tokens(out.o, "o");  // [1, B*T, HV, V]
  // 2-4. the transitions, the scan, the initial state of every segment
  const Shape st = segment_states_shape(p, ps);
  const TensorView h0s = ws.get(q, SegmentWorkspace::h0, p.compute, st);  // [Nseg, HV, K, V] or v_first
  segment_initial_states(be, ps, is, in.initial_state, plan, ws, h0s);
  // 5. one forward over all segments; each sequence's final state is its last segment's
  is.initial_state = h0s;
  const TensorView ht = out.final_state.empty() ? TensorView()
                                                 : ws.get(q, SegmentWorkspace::ht, out.final_state.dtype, st);
  be.forward(ps, is, {o, ht});
  if (ht.empty()) return;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (n, last segment of n)
  for (int64_t n = 0; n < p.N; ++n) pairs.push_back({n, plan.seq_seg[size_t(n) + 1] - 1});
  copy_entries(q, out.final_state, ht, pairs);
}

void segmented_backward(Backend& be, const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr,
                        const SegmentPlan& plan, SegmentWorkspace& ws) {
  if (!plan.split) return be.backward(p, in, d, gr);
  check_plan_fits(p, plan);
  check_cotangents(p, d);
  check_grads(p, in, gr);  // also: d_initial_state only with initial_state
  Queue& q = be.queue();
  const Problem ps = segment_problem(p, plan);
  Inputs is = segment_inputs(in);
  const TensorView d_o = packed_tokens(d.d_o, "d_o");
  const Shape st = segment_states_shape(p, ps);
  // 2. the initial state of every segment, as the forward computed it; 3. the d_final_state of every segment
  const TensorView h0s = ws.get(q, SegmentWorkspace::h0, p.compute, st);
  segment_initial_states(be, ps, is, in.initial_state, plan, ws, h0s);
  const TensorView dhts = ws.get(q, SegmentWorkspace::ht, p.compute, st);
  segment_final_grads(be, ps, is, d_o, d.d_final_state, plan, ws, dhts);
  // 4. one backward over all segments; dh0[n] is the first segment's (the others' are internal)
  Grads gs = gr;
  gs.dq = packed_tokens(gr.dq, "dq"), gs.dk = packed_tokens(gr.dk, "dk"), gs.dv = packed_tokens(gr.dv, "dv");
  gs.dg = packed_tokens(gr.dg, "dg"), gs.dbeta = packed_tokens(gr.dbeta, "dbeta");
  gs.d_initial_state = gr.d_initial_state.empty() ? TensorView()
                                                  : ws.get(q, SegmentWorkspace::dh0, gr.d_initial_state.dtype, st);
  is.initial_state = h0s;
  be.backward(ps, is, {d_o, dhts}, gs);
  if (gr.d_initial_state.empty()) return;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (n, first segment of n)
  for (int64_t n = 0; n < p.N; ++n) pairs.push_back({n, plan.seq_seg[size_t(n)]});
  copy_entries(q, gr.d_initial_state, gs.d_initial_state, pairs);
}

}  // namespace kcp::seg
