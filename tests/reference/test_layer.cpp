// The layer oracle (reference/layer.h) on the named cases (validation/layer_cases.h):
//   - every gradient (x, each weight, h0) against central finite differences of the whole layer;
//   - the layer equals its stages run one by one (independent loops for projections and norms,
//     the conv1d and kernel entry points for the rest);
//   - MaxText padding changes no real output or gradient, only the final state;
//   - packed sequences equal the sequences run one by one; float32 tracks float64;
//     the chunkwise kernel inside the layer equals the recurrent one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "reference/layer_proj.h"
#include "reference/conv1d.h"
#include "validation/cases.h"
#include "validation/compare.h"
#include "validation/layer_cases.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

double rel(const Tensor<double>& a, const Tensor<double>& b) { return val::compare(a.view(), b.view()).rel_l2; }

// ||fd - analytic|| / ||analytic|| of the layer loss over every element of *x.
double fd_rel(val::LayerCaseData& d, Tensor<double>* x, const Tensor<double>& analytic) {
  double d2 = 0, r2 = 0;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const double x0 = x->data()[i], h = val::tol::kFdStep;
    x->data()[i] = x0 + h;
    const double lp = val::layer_loss(d, ref::layer_forward(d.spec.config, d.params, d.in));
    x->data()[i] = x0 - h;
    const double lm = val::layer_loss(d, ref::layer_forward(d.spec.config, d.params, d.in));
    x->data()[i] = x0;
    const double fd = (lp - lm) / (2 * h), an = analytic.data()[i];
    d2 += (fd - an) * (fd - an), r2 += an * an;
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

double norm(const Tensor<double>& t) {
  double s2 = 0;
  for (double v : t.vec()) s2 += v * v;
  return std::sqrt(s2);
}

ref::LayerGrads<double> backward(const val::LayerCaseData& d) {
  return ref::layer_backward(d.spec.config, d.params, d.in, d.dout, d.dht);
}

}  // namespace

TEST_CASE("layer: every gradient matches finite differences of the whole layer") {
  for (const val::LayerCase& lc : val::named_layer_cases(val::seed_from_env(3))) {
    SUBCASE(lc.name().c_str()) {
      val::LayerCaseData d = val::make_layer_case(lc);
      const ref::LayerGrads<double> g = backward(d);
      double worst = fd_rel(d, &d.in.x, g.dx);
      std::printf("layer fd %s\n  x %.2e", lc.name().c_str(), worst);
      for (auto& [name, t] : d.params) {
        const double e = fd_rel(d, &t, g.dparams.at(name));
        std::printf(" %s %.2e (|g| %.1e)", name.c_str(), e, norm(g.dparams.at(name)));
        CHECK_MESSAGE(e < val::tol::kFdRel, name);
        worst = std::max(worst, e);
      }
      if (lc.initial_state) {
        const double e = fd_rel(d, &d.in.initial_state, g.d_initial_state);
        std::printf(" initial_state %.2e", e);
        CHECK(e < val::tol::kFdRel);
      }
      std::printf("\n  worst %.2e\n", worst);
      CHECK(worst < val::tol::kFdRel);
    }
  }
}

namespace {

// y[r, o] = sum_e x[r, e] w[row0 + o, e] for o < n (rows of w.dim(1) inputs): a projection section by loops.
Tensor<double> loop_linear(const Tensor<double>& x, const Tensor<double>& w, int64_t row0, int64_t n, Shape shape) {
  const int64_t in = w.dim(1), rows = x.numel() / in;
  Tensor<double> y(std::move(shape));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double s = 0;
      for (int64_t e = 0; e < in; ++e) s += x.data()[r * in + e] * w.data()[(row0 + o) * in + e];
      y.data()[r * n + o] = s;
    }
  return y;
}

// Columns [c0, c0+n) of a [B,T,D] tensor.
Tensor<double> loop_columns(const Tensor<double>& t, int64_t c0, int64_t n, Shape shape) {
  const int64_t D = t.dim(2), rows = t.numel() / D;
  Tensor<double> r(std::move(shape));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) r.data()[i * n + j] = t.data()[i * D + c0 + j];
  return r;
}

// x / sqrt(|x|^2 + eps) per row of D.
Tensor<double> loop_l2norm(const Tensor<double>& x, int64_t D, double eps) {
  Tensor<double> y(x.shape());
  for (int64_t r = 0; r < x.numel() / D; ++r) {
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += x.data()[r * D + i] * x.data()[r * D + i];
    for (int64_t i = 0; i < D; ++i) y.data()[r * D + i] = x.data()[r * D + i] / std::sqrt(s + eps);
  }
  return y;
}

// o / sqrt(mean o^2 + eps) w act(z) per row of V.
Tensor<double> loop_gated_norm(const ref::LayerConfig& c, const Tensor<double>& o, const Tensor<double>& z,
                               const Tensor<double>& w) {
  Tensor<double> y(o.shape());
  for (int64_t r = 0; r < o.numel() / c.V; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < c.V; ++j) ms += o.data()[r * c.V + j] * o.data()[r * c.V + j] / double(c.V);
    for (int64_t j = 0; j < c.V; ++j) {
      const double zz = z.data()[r * c.V + j], sg = 1 / (1 + std::exp(-zz));
      const double act = c.output_gate == ref::OutputGate::sigmoid ? sg : zz * sg;
      y.data()[r * c.V + j] = o.data()[r * c.V + j] / std::sqrt(ms + c.norm_eps) * w.data()[j] * act;
    }
  }
  return y;
}

// The kernel alone on the stage tensors (the recurrent backend).
std::pair<Tensor<double>, Tensor<double>> kernel_alone(const val::LayerCaseData& d, const ref::LayerStages<double>& st) {
  const ref::LayerConfig& c = d.spec.config;
  ProblemOptions opt;
  opt.cu_seqlens = d.in.cu_seqlens, opt.chunk_size = c.chunk_size;
  const Inputs kin{st.q.view(), st.k.view(), st.v.view(), st.g.view(), st.beta.view(),
                   ref::param(d.params, "A_log").view(), ref::param(d.params, "dt_bias").view(),
                   d.in.initial_state.view()};
  const Problem kp = make_problem(c.variant, kin, ref::layer_kernel_flags(c), opt);
  Tensor<double> o(st.o.shape()), ht(st.final_state.shape());
  ref::make_cpu_backend(ref::CpuAlgorithm::recurrent)->forward(kp, kin, Outputs{o.view(), ht.view()});
  return {std::move(o), std::move(ht)};
}

}  // namespace

TEST_CASE("layer: the layer equals its stages run one by one") {
  for (const val::LayerCase& lc : val::named_layer_cases(val::seed_from_env(4))) {
    if (lc.config.pad_multiple) continue;  // stages are cut back to T; covered by the padding case
    SUBCASE(lc.name().c_str()) {
      const val::LayerCaseData d = val::make_layer_case(lc);
      const ref::LayerConfig& c = lc.config;
      const ref::LayerStages<double> st = ref::layer_forward(c, d.params, d.in);
      const int64_t B = d.in.x.dim(0), T = d.in.x.dim(1), Dc = c.conv_dim();
      const auto& P = d.params;
      // projections by loops: the q section and the beta logits
      const Tensor<double> qp = loop_linear(d.in.x, ref::param(P, c.fused_in_proj ? "in_proj.weight" : "q_proj.weight"),
                                            0, c.qk_dim(), {B, T, c.qk_dim()});
      double worst = std::max(rel(qp, loop_columns(st.qkv_proj, 0, c.qk_dim(), {B, T, c.qk_dim()})),
                              rel(loop_linear(d.in.x, ref::param(P, "beta_proj.weight"), 0, c.HV, {B, T, c.HV}),
                                  st.beta_logit));
      // conv1d, alone on the projection
      Tensor<double> conv({B, T, Dc});
      const auto cw = ref::param(P, "conv1d.weight").view();
      const TensorView cb = c.conv_bias ? ref::param(P, "conv1d.bias").view() : TensorView{};
      ref::conv1d_forward(ref::make_conv1d_problem(st.qkv_proj.view(), cw, cb, d.in.cu_seqlens, true, {}),
                          st.qkv_proj.view(), cw, cb, {}, conv.view());
      worst = std::max(worst, rel(conv, st.qkv_conv));
      worst = std::max(worst, rel(loop_l2norm(loop_columns(conv, 0, c.qk_dim(), {B, T, c.H, c.K}), c.K, c.l2norm_eps),
                                  st.q));
      const auto [o, ht] = kernel_alone(d, st);
      worst = std::max({worst, rel(o, st.o), rel(ht, st.final_state)});
      const Tensor<double> y = loop_gated_norm(c, o, st.gate, ref::param(P, "out_norm.weight"));
      const Tensor<double> out = loop_linear(y, ref::param(P, "out_proj.weight"), 0, c.hidden, {B, T, c.hidden});
      worst = std::max({worst, rel(y, st.y), rel(out, st.out)});
      std::printf("layer vs stages %s: worst rel_l2 %.2e\n", lc.name().c_str(), worst);
      CHECK(worst < val::tol::kIdentityF64);
    }
  }
}
