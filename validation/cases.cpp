// make_case(): seeded inputs for a CaseSpec (distributions in cases.h).
#include "validation/cases.h"

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "core/rng.h"
#include "core/transition.h"

namespace kcp::val {
namespace {

enum Stream : uint64_t { kQ = 1, kK, kV, kG, kBeta, kALog, kDtBias, kH0, kDo, kDht };

Tensor<double> normal(const Shape& s, uint64_t seed, uint64_t stream, double sd = 1.0) {
  Tensor<double> t(s);
  const CounterRng rng{seed, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = sd * rng.normal(uint64_t(i));
  return t;
}

Tensor<double> uniform(const Shape& s, uint64_t seed, uint64_t stream, double lo, double hi) {
  Tensor<double> t(s);
  const CounterRng rng{seed, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.uniform(uint64_t(i), lo, hi);
  return t;
}

void l2normalize_last(Tensor<double>& t) {
  const int64_t D = t.shape().back();
  for (int64_t r = 0; r < t.numel() / D; ++r) {
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += t.data()[r * D + i] * t.data()[r * D + i];
    const double inv = 1.0 / std::sqrt(s);
    for (int64_t i = 0; i < D; ++i) t.data()[r * D + i] *= inv;
  }
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream os;
  const int64_t Tn = seqlens.empty() ? T : std::accumulate(seqlens.begin(), seqlens.end(), int64_t(0));
  os << variant_name(variant) << "(B=" << (seqlens.empty() ? B : 1) << ",T=" << Tn << ",H=" << H << ",HV=" << HV << ",K=" << K
     << ",V=" << V << ",C=" << chunk_size;
  if (!seqlens.empty()) {
    os << ",lens=";
    for (size_t i = 0; i < seqlens.size(); ++i) os << (i ? ":" : "") << seqlens[i];
  }
  if (initial_state) os << ",h0";
  if (final_state) os << ",ht";
  if (flags.use_qk_l2norm_in_kernel) os << ",l2norm";
  if (flags.use_beta_sigmoid_in_kernel) os << ",beta_sigmoid";
  if (flags.allow_neg_eigval) os << ",neg_eigval";
  if (flags.use_gate_in_kernel) {
    os << ",gate=" << (flags.lower_bound ? "lower_bound" : "softplus");
    if (!A_log) os << ",no_A_log";
    if (!dt_bias) os << ",no_dt_bias";
  }
  if (flags.state_v_first) os << ",state_v_first";
  if (scale) os << ",scale=" << *scale;
  os << ",seed=" << seed << ")";
  return os.str();
}

CaseData make_case(const CaseSpec& spec) {
  CaseData c;
  c.spec = spec;
  int64_t B = spec.B, T = spec.T;
  if (!spec.seqlens.empty()) {
    B = 1;
    T = std::accumulate(spec.seqlens.begin(), spec.seqlens.end(), int64_t(0));
    c.cu_seqlens.assign(1, 0);
    for (int64_t len : spec.seqlens) c.cu_seqlens.push_back(c.cu_seqlens.back() + len);
    c.spec.B = B, c.spec.T = T;
  }
  const int64_t N = spec.seqlens.empty() ? B : int64_t(spec.seqlens.size());
  const Flags& f = spec.flags;
  const uint64_t s = spec.seed;
  c.q = normal({B, T, spec.H, spec.K}, s, kQ);
  c.k = normal({B, T, spec.H, spec.K}, s, kK);
  if (!f.use_qk_l2norm_in_kernel) l2normalize_last(c.q), l2normalize_last(c.k);
  c.v = normal({B, T, spec.HV, spec.V}, s, kV);
  const Shape gshape = spec.variant == Variant::gdn ? Shape{B, T, spec.HV} : Shape{B, T, spec.HV, spec.K};
  c.g = f.use_gate_in_kernel ? normal(gshape, s, kG) : uniform(gshape, s, kG, -0.3, -0.001);
  if (f.use_gate_in_kernel) {
    if (spec.A_log) {
      c.A_log = uniform({spec.HV}, s, kALog, 1.0, 16.0);
      for (double& x : c.A_log.vec()) x = std::log(x);
    }
    if (spec.dt_bias)
      c.dt_bias = normal({spec.variant == Variant::gdn ? spec.HV : spec.HV * spec.K}, s, kDtBias, 0.5);
  }
  if (spec.variant != Variant::gla)
    c.beta = f.use_beta_sigmoid_in_kernel ? normal({B, T, spec.HV}, s, kBeta) : uniform({B, T, spec.HV}, s, kBeta, 0, 1);
  const Shape st = f.state_v_first ? Shape{N, spec.HV, spec.V, spec.K} : Shape{N, spec.HV, spec.K, spec.V};
  if (spec.initial_state) c.h0 = normal(st, s, kH0);
  c.d_o = normal({B, T, spec.HV, spec.V}, s, kDo);
  if (spec.final_state) c.dht = normal(st, s, kDht);
  return c;
}

Inputs CaseData::inputs() const {
  return {q.view(), k.view(), v.view(), g.view(), beta.view(), A_log.view(), dt_bias.view(), h0.view()};
}

Cotangents CaseData::cotangents() const { return {d_o.view(), dht.view()}; }

Problem CaseData::problem(DType compute) const {
  ProblemOptions opt;
  opt.scale = spec.scale;
  opt.chunk_size = spec.chunk_size;
  opt.compute = compute;
  opt.cu_seqlens = cu_seqlens;
  return make_problem(spec.variant, inputs(), spec.flags, opt);
}

template <class S>
OutputSet<S> make_outputs(const Problem& p, bool final_state) {
  OutputSet<S> o;
  o.o = Tensor<S>(shape_v(p));
  if (final_state) o.final_state = Tensor<S>(shape_state(p));
  return o;
}

template <class S>
GradSet<S> make_grads(const Problem& p, const Inputs& in) {
  GradSet<S> g;
  g.dq = Tensor<S>(shape_qk(p));
  g.dk = Tensor<S>(shape_qk(p));
  g.dv = Tensor<S>(shape_v(p));
  g.dg = Tensor<S>(shape_g(p));
  if (p.delta_rule()) g.dbeta = Tensor<S>(shape_beta(p));
  if (!in.initial_state.empty()) g.dh0 = Tensor<S>(shape_state(p));
  if (!in.A_log.empty()) g.dA_log = Tensor<S>({p.HV});
  if (!in.dt_bias.empty()) g.ddt_bias = Tensor<S>(shape_dt_bias(p));
  return g;
}

template OutputSet<double> make_outputs<double>(const Problem&, bool);
template OutputSet<float> make_outputs<float>(const Problem&, bool);
template GradSet<double> make_grads<double>(const Problem&, const Inputs&);
template GradSet<float> make_grads<float>(const Problem&, const Inputs&);

uint64_t seed_from_env(uint64_t fallback) {
  const char* s = std::getenv("KCP_SEED");
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}

SeqTransition sequence_transition(Backend& be, const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq,
                                  bool backward) {
  Tensor<double> packed(transition_shape(1, p.HV, p.K, p.V));
  Tensor<float> packed32(transition_shape(1, p.HV, p.K, p.V));
  const TensorView buf = p.compute == DType::f64 ? packed.view() : packed32.view();
  if (backward) be.transition_backward(p, in, d_o, seq, buf);
  else be.transition_forward(p, in, seq, buf);
  const TensorView e = transition_element(buf, 0);
  return {to_tensor<double>(transition_s(e)), to_tensor<double>(transition_m(e))};
}

}  // namespace kcp::val
