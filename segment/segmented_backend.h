// SegmentedBackend: any Backend whose forward (and, with a forced cut, backward) runs through the
// intra-card CP plan (segment/plan.h, segment/segmented.h); every other call goes to the wrapped
// backend unchanged. The plan is made per
// call from the problem and the queue's multiprocessor count; explain_forward(p) prints it (kcp bench
// --explain). The registry (validation/registry.cpp) wraps cuda-chunkwise this way, with the options
// of KCP_CUDA_SEGMENT (auto | off | <tokens>); tests wrap the CPU backends with a forced length.
// Covered by tests/segment/test_segmented.cpp and tests/cuda/test_cuda_segmented.cpp.
#pragma once

#include <memory>

#include "core/forwarding_backend.h"
#include "segment/segmented.h"

namespace kcp::seg {

class SegmentedBackend final : public ForwardingBackend {
 public:
  SegmentedBackend(std::unique_ptr<Backend> inner, SegmentOptions opt)
      : ForwardingBackend(std::move(inner)), opt_(opt) {}
  void forward(const Problem& p, const Inputs& in, const Outputs& out) override;
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) override;
  // Forwarded where the forward runs unsplit (a cut forward calls the inner one per segment).
  void forward_prepare(const Problem& p, const Inputs& in) override {
    if (inner().supports(p) && !plan(p).split) inner().forward_prepare(p, in);
  }
  // Forwarded where the backward runs unsplit (a cut backward calls the inner one per segment).
  void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) override {
    if (opt_.mode != SegmentMode::forced) inner().backward_prepare(p, in, d_o);
  }
  std::string explain_forward(const Problem& p) const override { return plan(p).describe(); }

  SegmentPlan plan(const Problem& p) const;  // what forward(p, ...) does (for the views it accepts)
  const SegmentOptions& options() const { return opt_; }
  void set_options(const SegmentOptions& opt) { opt_ = opt; }

 private:
  SegmentOptions opt_;
  SegmentWorkspace ws_;
};

std::unique_ptr<Backend> make_segmented_backend(std::unique_ptr<Backend> inner, const SegmentOptions& opt);

}  // namespace kcp::seg
