// ForwardingBackend: a Backend that passes every call to another one. Subclasses override what they
// change and call the base for the real work: the segmented forward (segment/segmented_backend.h), the
// shape adapter (core/padded_backend.h), and tests and tools that observe or perturb one operation
// (count calls, inject a fault, track memory).
// Used by segment/, tests/cp/test_cp_mpi.cpp, tests/cp/cp_fault_job.cpp, tests/validation/test_dump_runner.cpp.
#pragma once

#include <memory>
#include <utility>

#include "core/backend.h"

namespace kcp {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Support supports(const Problem& p) const override { return inner_->supports(p); }
  Support supports_backward(const Problem& p) const override { return inner_->supports_backward(p); }
  Support supports_conv1d(const Conv1dProblem& p) const override { return inner_->supports_conv1d(p); }
  void forward(const Problem& p, const Inputs& in, const Outputs& o) override { inner_->forward(p, in, o); }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    inner_->backward(p, in, d, g);
  }
  void forward_prepare(const Problem& p, const Inputs& in) override { inner_->forward_prepare(p, in); }
  void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) override {
    inner_->backward_prepare(p, in, d_o);
  }
  void set_inputs_unchanged(bool on) override { inner_->set_inputs_unchanged(on); }
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) override {
    inner_->transition_forward(p, in, seq_begin, packed);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                           const TensorView& packed) override {
    inner_->transition_backward(p, in, d_o, seq_begin, packed);
  }
  void conv1d_forward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& y) override {
    inner_->conv1d_forward(p, t, y);
  }
  void conv1d_backward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& dy,
                       const Conv1dGrads& g) override {
    inner_->conv1d_backward(p, t, dy, g);
  }
  std::string explain_forward(const Problem& p) const override { return inner_->explain_forward(p); }
  std::string explain_last_forward() const override { return inner_->explain_last_forward(); }
  Queue& queue() const override { return inner_->queue(); }
  Device device() const override { return inner_->device(); }  // without creating the inner queue

 protected:
  Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace kcp
