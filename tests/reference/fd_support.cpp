// fd_check(): see fd_support.h.
#include "reference/fd_support.h"

#include <cmath>

#include "validation/registry.h"
#include "validation/tolerance.h"

namespace kcp::test {
namespace {

double loss(Backend& be, const val::CaseData& c) {
  const Problem p = c.problem(DType::f64);
  auto out = val::make_outputs<double>(p, !c.dht.empty());
  be.forward(p, c.inputs(), out.views());
  double L = 0;
  for (int64_t i = 0; i < out.o.numel(); ++i) L += out.o.data()[i] * c.d_o.data()[i];
  for (int64_t i = 0; i < out.final_state.numel(); ++i) L += out.final_state.data()[i] * c.dht.data()[i];
  return L;
}

}  // namespace

std::vector<FdResult> fd_check(const val::CaseData& c0, const std::string& backend) {
  auto be = val::backend_create(backend);
  val::CaseData c = c0;
  const Problem p = c.problem(DType::f64);
  auto gr = val::make_grads<double>(p, c.inputs());
  be->backward(p, c.inputs(), c.cotangents(), gr.views());
  struct Pair { const char* name; Tensor<double>* x; const Tensor<double>* dx; };
  const Pair pairs[] = {{"q", &c.q, &gr.dq},         {"k", &c.k, &gr.dk},       {"v", &c.v, &gr.dv},
                        {"g", &c.g, &gr.dg},         {"beta", &c.beta, &gr.dbeta}, {"A_log", &c.A_log, &gr.dA_log},
                        {"dt_bias", &c.dt_bias, &gr.ddt_bias}, {"initial_state", &c.h0, &gr.dh0}};
  std::vector<FdResult> res;
  const double h = val::tol::kFdStep;
  for (const Pair& pr : pairs) {
    if (pr.x->numel() == 0 || pr.x->empty()) continue;
    double diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < pr.x->numel(); ++i) {
      double& x = pr.x->data()[i];
      const double x0 = x;
      x = x0 + h;
      const double lp = loss(*be, c);
      x = x0 - h;
      const double lm = loss(*be, c);
      x = x0;
      const double fd = (lp - lm) / (2 * h), an = pr.dx->data()[i];
      diff2 += (fd - an) * (fd - an), ref2 += an * an;
    }
    res.push_back({pr.name, ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2), std::sqrt(ref2)});
  }
  return res;
}

}  // namespace kcp::test
