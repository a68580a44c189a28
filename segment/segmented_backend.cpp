// SegmentedBackend (see segmented_backend.h).
#include "segment/segmented_backend.h"

namespace kcp::seg {

SegmentPlan SegmentedBackend::plan(const Problem& p) const {
  return plan_segments(p, queue().multiprocessor_count(), opt_);
}

void SegmentedBackend::forward(const Problem& p, const Inputs& in, const Outputs& out) {
  if (!inner().supports(p)) return inner().forward(p, in, out);  // the inner backend's own refusal
  SegmentPlan pl = plan(p);
  if (pl.split && !batch_mergeable(p, in, out)) pl = SegmentPlan{};  // a strided batch runs unsplit
  segmented_forward(inner(), p, in, out, pl, ws_);
}

// Only a forced cut reaches the backward: the automatic plan's model prices the forward's state stage,
// and a cut backward also reruns the forward transitions (segmented.h, step 2), so it would need its
// own model before an automatic plan may cut it.
void SegmentedBackend::backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) {
  if (!inner().supports_backward(p) || opt_.mode != SegmentMode::forced) return inner().backward(p, in, d, gr);
  SegmentPlan pl = plan(p);
  if (pl.split && !batch_mergeable(p, in, d, gr)) pl = SegmentPlan{};  // a strided batch runs unsplit
  segmented_backward(inner(), p, in, d, gr, pl, ws_);
}

std::unique_ptr<Backend> make_segmented_backend(std::unique_ptr<Backend> inner, const SegmentOptions& opt) {
  return std::make_unique<SegmentedBackend>(std::move(inner), opt);
}

}  // namespace kcp::seg
