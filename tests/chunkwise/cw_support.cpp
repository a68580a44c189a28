// run_backend() and compare_runs(): see cw_support.h.
#include "tests/chunkwise/cw_support.h"

#include <cmath>
#include <utility>

#include "validation/compare.h"
#include "validation/registry.h"

namespace kcp::test {
namespace {

template <class S>
std::vector<std::pair<std::string, TensorView>> named(const BackendRun<S>& r) {
  return {{"o", r.out.o.view()},          {"final_state", r.out.final_state.view()}, {"dq", r.gr.dq.view()},
          {"dk", r.gr.dk.view()},         {"dv", r.gr.dv.view()},                    {"dg", r.gr.dg.view()},
          {"dbeta", r.gr.dbeta.view()},   {"dh0", r.gr.dh0.view()},                  {"dA_log", r.gr.dA_log.view()},
          {"ddt_bias", r.gr.ddt_bias.view()}};
}

double norm(const TensorView& v) {
  double s = 0;
  for (int64_t i = 0; i < v.numel(); ++i) s += v.get(i) * v.get(i);
  return std::sqrt(s);
}

}  // namespace

template <class S>
BackendRun<S> run_backend(const std::string& backend, const val::CaseData& c) {
  auto be = val::backend_create(backend);
  const Problem p = c.problem(dtype_of<S>());
  BackendRun<S> r;
  r.out = val::make_outputs<S>(p, c.spec.final_state);
  r.gr = val::make_grads<S>(p, c.inputs());
  be->forward(p, c.inputs(), r.out.views());
  be->backward(p, c.inputs(), c.cotangents(), r.gr.views());
  return r;
}

template <class A, class B>
std::vector<TensorErr> compare_runs(const BackendRun<A>& cand, const BackendRun<B>& ref) {
  std::vector<TensorErr> out;
  const auto a = named(cand), b = named(ref);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second.empty() || b[i].second.empty()) continue;
    out.push_back({a[i].first, val::compare(a[i].second, b[i].second).rel_l2, norm(b[i].second)});
  }
  return out;
}

template BackendRun<double> run_backend<double>(const std::string&, const val::CaseData&);
template BackendRun<float> run_backend<float>(const std::string&, const val::CaseData&);
template std::vector<TensorErr> compare_runs<double, double>(const BackendRun<double>&, const BackendRun<double>&);
template std::vector<TensorErr> compare_runs<float, double>(const BackendRun<float>&, const BackendRun<double>&);

}  // namespace kcp::test
