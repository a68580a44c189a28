// The cp-sweep rows (see sweep_run.h).
#include "app/cp_sweep_run.h"

#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "cp/conv1d_cp.h"
#include "reference/conv1d.h"
#include "validation/compare.h"
#include "validation/mirror.h"
#include "validation/tolerance.h"

namespace kcp::app {
using namespace kcp::val;
using namespace kcp::cp;
namespace {

template <class S>
NamedViews named_of(const val::OutputSet<S>& o, const val::GradSet<S>& g) {
  NamedViews all = {{"o", o.o.view()},         {"ht", o.final_state.view()}, {"dq", g.dq.view()},
                    {"dk", g.dk.view()},       {"dv", g.dv.view()},          {"dg", g.dg.view()},
                    {"dbeta", g.dbeta.view()}, {"dh0", g.dh0.view()},        {"dA_log", g.dA_log.view()},
                    {"ddt_bias", g.ddt_bias.view()}};
  NamedViews out;
  for (auto& [n, v] : all)
    if (!v.empty()) out.emplace_back(n, v);
  return out;
}

// Sums a whole tensor over ranks in place (each element is nonzero on at most one rank).
template <class S> void assemble(Comm& comm, const Tensor<S>& t) {
  if (t.numel()) all_reduce_sum(comm, const_cast<S*>(t.data()), t.numel());
}

// Whether every rank holds bitwise the same values.
template <class S> bool same_on_all_ranks(Comm& comm, const Tensor<S>& t) {
  std::vector<S> hi(t.vec()), neg(t.vec());
  for (S& x : neg) x = -x;
  all_reduce_max(comm, hi.data(), int64_t(hi.size()));
  all_reduce_max(comm, neg.data(), int64_t(neg.size()));
  for (size_t i = 0; i < hi.size(); ++i)
    if (hi[i] != t.vec()[i] || -neg[i] != t.vec()[i]) return false;
  return true;
}

// The bar of a row's tensor: float64 exact; float32 the rule on the baseline error, with the floor of
// the device whose kernels computed it (3xTF32 on the CUDA device, validation/float_rule.h).
double row_bar(DType dt, double base, double cond, Device device) {
  return dt == DType::f64 ? val::tol::kExactF64 : val::float_rule_bar(base, cond, device);
}

void judge(RowVerdict& v, const std::string& name, const TensorView& cand, const TensorView& ref, double bar) {
  const val::Metrics m = val::compare(cand, ref);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%s %.1e", v.errors.empty() ? "" : " ", name.c_str(), m.rel_l2);
  v.errors += buf;
  const bool ok = m.finite_ok() && m.rel_l2 <= bar;
  v.worst_ratio = std::max(v.worst_ratio, std::isnan(m.rel_l2) ? INFINITY : m.rel_l2 / bar);
  if (ok || !v.pass) return;
  v.pass = false;
  std::snprintf(buf, sizeof buf, " > bar %.1e", bar);
  v.failure = name + ": rel_l2 " + std::to_string(m.rel_l2) + buf + ", worst at " + val::index_str(m.max_abs_at) +
              " cp " + std::to_string(m.a_at) + " oracle " + std::to_string(m.b_at) +
              (m.finite_ok() ? "" : " (NaN/Inf)");
}

Tensor<double> randn(const Shape& s, uint64_t seed, uint64_t stream) {
  Tensor<double> t(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = CounterRng{seed, stream}.normal(uint64_t(i));
  return t;
}

std::vector<int64_t> cu_of(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu = {0};
  for (int64_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

template <class S>
RowVerdict cp_row(Comm& comm, Backend& be, const val::CaseData& c, const SweepReference& ref,
                  const std::vector<double>& base_err, const SweepLayout& L, MergeAlgorithm merge, DType dt) {
  const bool backward = be.supports_backward(c.problem(dt)).ok;  // forward-only backends: o and ht
  const CpCaseResult<S> r = run_cp_case<S>(comm, be, c, L.bounds, merge, backward);
  RowVerdict v;
  const NamedViews cand = r.named(), want = ref.named();  // cand is a prefix of want (o, ht, gradients)
  for (size_t i = 0; i < cand.size(); ++i) {
    KCP_CHECK(cand[i].first == want[i].first, "cp-sweep: tensor lists differ at ", cand[i].first);
    judge(v, cand[i].first, cand[i].second, want[i].second,
          row_bar(dt, base_err[i], ref.cond.of(cand[i].first), be.device()));
  }
  if (!r.params_agree && v.pass) v.pass = false, v.failure = "parameter gradients differ between ranks";
  return v;
}

}  // namespace

NamedViews SweepReference::named() const { return named_of(out, grads); }

template <class S>
NamedViews CpCaseResult<S>::named() const { return named_of(out, grads); }

namespace {

// One forward (and backward) of cp on case c's inputs, staged for this rank, results into r's views.
template <class S>
void run_cp_round(ContextParallel& cp, Backend& be, const val::CaseData& c, CpCaseResult<S>& r, bool backward) {
  const DType dt = dtype_of<S>();
  const int64_t lo = cp.context().lo, n = cp.context().tokens();
  // Inputs in the compute precision on the backend's device (host backends read the float64 views).
  val::DeviceMirror dev(be);
  Inputs in = c.inputs();
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) *t = dev.input(t->narrow(1, lo, n), dt);
  for (TensorView* t : {&in.A_log, &in.dt_bias, &in.initial_state}) *t = dev.input(*t, dt);
  const TensorView d_o = dev.input(c.d_o.view().narrow(1, lo, n), dt), dht = dev.input(c.dht.view(), dt);
  cp.forward(in, {dev.output(r.out.o.view().narrow(1, lo, n)), dev.output(r.out.final_state.view())});
  if (backward) {
    Grads g = r.grads.views();
    for (TensorView* t : {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta}) *t = dev.output(t->narrow(1, lo, n));
    for (TensorView* t : {&g.d_initial_state, &g.dA_log, &g.ddt_bias}) *t = dev.output(*t);
    cp.backward(in, {d_o, dht}, g);
  }
  dev.download();
}

}  // namespace

template <class S>
CpCaseResult<S> run_cp_case(Comm& comm, Backend& be, const val::CaseData& c, const std::vector<int64_t>& bounds,
                            MergeAlgorithm merge, bool backward, const val::CaseData* earlier) {
  const DType dt = dtype_of<S>();
  const Problem pg = c.problem(dt);
  auto result = [&] {
    return CpCaseResult<S>{val::make_outputs<S>(pg, c.spec.final_state),
                           backward ? val::make_grads<S>(pg, c.inputs()) : val::GradSet<S>{}, true};
  };
  CpCaseResult<S> r = result();
  ProblemOptions po;
  po.scale = c.spec.scale, po.chunk_size = c.spec.chunk_size, po.compute = dt, po.cu_seqlens = c.cu_seqlens;
  ContextParallel cp(comm, be, c.spec.variant, c.spec.flags, {po, bounds, merge});
  if (earlier) {  // the same object called first on other inputs: what it keeps must not leak into r
    CpCaseResult<S> scratch = result();
    run_cp_round(cp, be, *earlier, scratch, backward);
  }
  run_cp_round(cp, be, c, r, backward);
  Comm& host = comm.control();
  for (const Tensor<S>* t : {&r.out.o, &r.out.final_state, &r.grads.dq, &r.grads.dk, &r.grads.dv, &r.grads.dg,
                             &r.grads.dbeta, &r.grads.dh0})
    assemble(host, *t);
  for (const Tensor<S>* t : {&r.grads.dA_log, &r.grads.ddt_bias}) r.params_agree &= same_on_all_ranks(host, *t);
  return r;
}

template struct CpCaseResult<double>;
template struct CpCaseResult<float>;
template CpCaseResult<double> run_cp_case<double>(Comm&, Backend&, const val::CaseData&, const std::vector<int64_t>&,
                                                  MergeAlgorithm, bool, const val::CaseData*);
template CpCaseResult<float> run_cp_case<float>(Comm&, Backend&, const val::CaseData&, const std::vector<int64_t>&,
                                                MergeAlgorithm, bool, const val::CaseData*);

SweepReference sweep_reference(const val::CaseData& c, Backend& oracle) {
  SweepReference r;
  const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
  r.out = val::make_outputs<double>(p64, c.spec.final_state);
  r.grads = val::make_grads<double>(p64, c.inputs());
  oracle.forward(p64, c.inputs(), r.out.views());
  oracle.backward(p64, c.inputs(), c.cotangents(), r.grads.views());
  auto out32 = val::make_outputs<float>(p32, c.spec.final_state);
  auto gr32 = val::make_grads<float>(p32, c.inputs());
  oracle.forward(p32, c.inputs(), out32.views());
  oracle.backward(p32, c.inputs(), c.cotangents(), gr32.views());
  const NamedViews a = named_of(out32, gr32), b = r.named();
  for (size_t i = 0; i < a.size(); ++i) r.base_err.push_back(val::compare(a[i].second, b[i].second).rel_l2);
  r.cond = val::grad_conditioning(p64, c.inputs(), c.cotangents(), r.grads.dg.view());
  return r;
}

RowVerdict sweep_cp_row(Comm& comm, Backend& backend, const val::CaseData& c, const SweepReference& ref,
                        const std::vector<double>& base_err, const SweepLayout& layout, MergeAlgorithm merge,
                        DType compute) {
  if (compute == DType::f64) return cp_row<double>(comm, backend, c, ref, base_err, layout, merge, compute);
  return cp_row<float>(comm, backend, c, ref, base_err, layout, merge, compute);
}

std::vector<double> sweep_single_errors(Backend& backend, const val::CaseData& c, const SweepReference& ref) {
  const Problem p = c.problem(DType::f32);
  const bool backward = backend.supports_backward(p).ok;
  auto out = val::make_outputs<float>(p, c.spec.final_state);
  auto gr = backward ? val::make_grads<float>(p, c.inputs()) : val::GradSet<float>{};
  val::DeviceMirror dev(backend);
  Inputs in = c.inputs();
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.A_log, &in.dt_bias, &in.initial_state})
    *t = dev.input(*t, DType::f32);
  backend.forward(p, in, {dev.output(out.o.view()), dev.output(out.final_state.view())});
  if (backward) {
    const Grads g = gr.views();
    backend.backward(p, in, {dev.input(c.d_o.view(), DType::f32), dev.input(c.dht.view(), DType::f32)},
                     {dev.output(g.dq), dev.output(g.dk), dev.output(g.dv), dev.output(g.dg), dev.output(g.dbeta),
                      dev.output(g.d_initial_state), dev.output(g.dA_log), dev.output(g.ddt_bias)});
  }
  dev.download();
  const NamedViews a = named_of(out, gr), b = ref.named();
  std::vector<double> err;
  for (size_t i = 0; i < a.size(); ++i) err.push_back(val::compare(a[i].second, b[i].second).rel_l2);
  return err;
}

std::string sweep_backend_notes(const SweepReference& ref, const std::vector<double>& single, Device device) {
  std::string notes;
  const NamedViews names = ref.named();
  for (size_t i = 0; i < single.size(); ++i) {
    const double rule = val::float_rule_bar(ref.base_err[i], ref.cond.of(names[i].first), device);
    if (single[i] <= rule) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.1e > rule %.1e", notes.empty() ? "" : ", ", names[i].first.c_str(),
                  single[i], rule);
    notes += buf;
  }
  return notes;
}

RowVerdict sweep_conv_row(Comm& comm, Backend& be, const SweepLayout& L, int64_t W, bool silu_bias, DType dt,
                          uint64_t seed) {
  const std::vector<int64_t> cu = cu_of(L.seqlens);
  const int64_t T = cu.back(), D = 5;
  const Tensor<double> x = randn({1, T, D}, seed, 1), w = randn({D, W}, seed, 2), dy = randn({1, T, D}, seed, 4);
  const Tensor<double> b = silu_bias ? randn({D}, seed, 3) : Tensor<double>();
  // single process: float64 oracle and float32 baseline; outputs [y, dx, dw, db]
  auto run_single = [&](DType prec) {
    std::vector<Tensor<double>> r = {Tensor<double>(x.shape()), Tensor<double>(x.shape()), Tensor<double>(w.shape()),
                                     silu_bias ? Tensor<double>({D}) : Tensor<double>()};
    const auto p = ref::make_conv1d_problem(x.view(), w.view(), b.view(), cu, silu_bias, {}, prec);
    ref::conv1d_forward(p, x.view(), w.view(), b.view(), {}, r[0].view());
    ref::conv1d_backward(p, x.view(), w.view(), b.view(), {}, dy.view(), r[1].view(), r[2].view(), r[3].view(), {});
    return r;
  };
  const auto oracle = run_single(DType::f64), base = run_single(DType::f32);
  const CpContext ctx = build_cp_context(cu, L.bounds.empty() ? equal_bounds(T, comm.size()) : L.bounds, comm.rank());
  std::vector<Tensor<double>> got = {Tensor<double>(x.shape()), Tensor<double>(x.shape()), Tensor<double>(w.shape()),
                                     silu_bias ? Tensor<double>({D}) : Tensor<double>()};
  const ConvCp cc{cu, ctx, silu_bias, dt};
  const int64_t lo = ctx.lo, n = ctx.tokens();
  val::DeviceMirror dev(be);
  const TensorView xl = dev.input(x.view().narrow(1, lo, n), dt), wd = dev.input(w.view(), dt),
                   bd = dev.input(b.view(), dt), dyl = dev.input(dy.view().narrow(1, lo, n), dt);
  conv1d_cp_forward(comm, be, cc, xl, wd, bd, dev.output(got[0].view().narrow(1, lo, n)));
  conv1d_cp_backward(comm, be, cc, xl, wd, bd, dyl, dev.output(got[1].view().narrow(1, lo, n)),
                     dev.output(got[2].view()), dev.output(got[3].view()));
  dev.download();
  Comm& host = comm.control();
  assemble(host, got[0]), assemble(host, got[1]);
  RowVerdict v;
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t i = 0; i < 4; ++i) {
    if (got[i].numel() == 0) continue;
    // conv1d is plain float32 on every device (no split products): the host's floor
    judge(v, names[i], got[i].view(), oracle[i].view(),
          row_bar(dt, val::compare(base[i].view(), oracle[i].view()).rel_l2, 1.0, Device::host));
  }
  if ((!same_on_all_ranks(host, got[2]) || !same_on_all_ranks(host, got[3])) && v.pass)
    v.pass = false, v.failure = "dw/db differ between ranks";
  return v;
}

}  // namespace kcp::app
