// A CP job in which rank 1 throws inside its transition while the other ranks wait in the exchange.
// run_mpi_command must abort the whole job with rank 1's message; fault_test.sh runs it under
// mpirun with a time limit and fails if the job hangs, exits 0 or loses the message.
#include "cp/comm_mpi.h"
#include "cp/context_parallel.h"
#include "validation/cases.h"
#include "validation/registry.h"

using namespace kcp;

namespace {

class FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::unique_ptr<Backend> b, bool fail) : inner_(std::move(b)), fail_(fail) {}
  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  Support supports(const Problem& p) const override { return inner_->supports(p); }
  void forward(const Problem& p, const Inputs& in, const Outputs& o) override { inner_->forward(p, in, o); }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    inner_->backward(p, in, d, g);
  }
  void transition_forward(const Problem& p, const Inputs& in, int64_t s, const Transition& t) override {
    KCP_CHECK(!fail_, "injected fault in transition_forward");
    inner_->transition_forward(p, in, s, t);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t s,
                           const Transition& t) override {
    inner_->transition_backward(p, in, d_o, s, t);
  }

 private:
  std::unique_ptr<Backend> inner_;
  bool fail_;
};

}  // namespace

int main() {
  return cp::run_mpi_command("cp_fault_job", [](cp::Comm& w) {
    val::CaseSpec s;
    s.seqlens = {40 * w.size()}, s.K = s.V = 8, s.H = s.HV = 1;
    const val::CaseData c = val::make_case(s);
    FaultyBackend be(val::backend_create("cpu-recurrent"), w.rank() == 1);
    ProblemOptions po;
    po.cu_seqlens = c.cu_seqlens;
    cp::ContextParallel cp(w, be, s.variant, s.flags, {po, {}, cp::MergeAlgorithm::linear});
    const int64_t lo = cp.context().lo, n = cp.context().tokens();
    Inputs in = c.inputs();
    for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta})
      t->data = static_cast<double*>(t->data) + lo * t->stride[1], t->shape[1] = n;
    Tensor<double> o({1, n, 1, 8}), ht(c.h0.shape());
    cp.forward(in, {o.view(), ht.view()});
    return 0;
  });
}
