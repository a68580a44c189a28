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

std::unique_ptr<Backend> make_segmented_backend(std::unique_ptr<Backend> inner, const SegmentOptions& opt) {
  return std::make_unique<SegmentedBackend>(std::move(inner), opt);
}

}  // namespace kcp::seg
