// segmented_forward (see segmented.h): the steps 1-5 of its header, each a Backend or Queue call.
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

void segmented_forward(Backend& be, const Problem& p, const Inputs& in, const Outputs& out, const SegmentPlan& plan,
                       SegmentWorkspace& ws) {
  if (!plan.split) return be.forward(p, in, out);
  bool fits = int64_t(plan.seq_seg.size()) == p.N + 1;
  for (int64_t n = 0; fits && n < p.N; ++n) {
    const SeqRange r = p.sequence(n);
    const int64_t s0 = plan.seq_seg[size_t(n)], s1 = plan.seq_seg[size_t(n) + 1];
    fits = s0 < s1 && s1 < int64_t(plan.cu.size()) && plan.cu[size_t(s0)] == r.b * p.T + r.t0 &&
           plan.cu[size_t(s1)] == r.b * p.T + r.t0 + r.len;
  }
  KCP_CHECK(fits, "segmented forward: the plan was made for another problem (its segments do not tile the ", p.N,
            " sequences of ", p.describe(), ")");
  Queue& q = be.queue();
  const bool vf = p.flags.state_v_first;
  const int64_t HV = p.HV, K = p.K, V = p.V, first = plan.transition_first, E = plan.transition_count;
  // 1. the segments as packed sequences
  Problem ps = p;
  ps.B = 1, ps.T = p.B * p.T, ps.N = plan.segments(), ps.cu_seqlens = plan.cu;
  Inputs is = in;
  is.q = packed_tokens(in.q, "q"), is.k = packed_tokens(in.k, "k"), is.v = packed_tokens(in.v, "v");
  is.g = packed_tokens(in.g, "g"), is.beta = packed_tokens(in.beta, "beta"), is.initial_state = {};
  const TensorView o = packed_tokens(out.o, "o");
  // 2. (S_ext, M) of every segment whose successor needs its state, in one call
  const TensorView elems = ws.get(q, SegmentWorkspace::elems, p.compute, transition_shape(E, HV, K, V));
  if (E > 0) be.transition_forward(ps, is, first, elems);
  // 3. a cut sequence's first segment starts from its h0; 4. the scan, one range per cut sequence
  std::vector<TransitionRange> ranges;
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t s0 = plan.seq_seg[size_t(n)], s1 = plan.seq_seg[size_t(n) + 1];
    if (s1 - s0 < 2) continue;
    ranges.push_back({s0 - first, s1 - s0 - 1});
    if (!in.initial_state.empty())
      q.transition_start(transition_element(elems, s0 - first), state_entry_kmajor(in.initial_state, n, vf));
  }
  const TensorView states = ws.get(q, SegmentWorkspace::states, p.compute, {E, HV, K, V});
  q.transition_scan(elems, ranges, states);
  // 5. the initial state of every segment, then one forward over all segments
  const Shape st = vf ? Shape{ps.N, HV, V, K} : Shape{ps.N, HV, K, V};
  is.initial_state = ws.get(q, SegmentWorkspace::h0, p.compute, st);
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (first segment of n, n)
  for (int64_t n = 0; n < p.N; ++n) pairs.push_back({plan.seq_seg[size_t(n)], n});
  if (in.initial_state.empty()) q.fill_zero(is.initial_state);
  else copy_entries(q, is.initial_state, in.initial_state, pairs);
  for (const TransitionRange& r : ranges)  // the state after element j starts segment first + j + 1
    q.copy_view(kmajor(is.initial_state, vf).narrow(0, first + r.first + 1, r.count), states.narrow(0, r.first, r.count));
  const TensorView ht = out.final_state.empty() ? TensorView()
                                                 : ws.get(q, SegmentWorkspace::ht, out.final_state.dtype, st);
  be.forward(ps, is, {o, ht});
  if (ht.empty()) return;
  pairs.clear();  // (n, last segment of n)
  for (int64_t n = 0; n < p.N; ++n) pairs.push_back({n, plan.seq_seg[size_t(n) + 1] - 1});
  copy_entries(q, out.final_state, ht, pairs);
}

}  // namespace kcp::seg
