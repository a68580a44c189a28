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

TEST_CASE("layer: the layer equals its stages run one by one") {
  for (const val::LayerCase& lc : val::named_layer_cases(val::seed_from_env(4))) {
    if (lc.config.pad_multiple) continue;  // stages are cut back to T; covered by the padding case
    SUBCASE(lc.name().c_str()) {
      const val::LayerCaseData d = val::make_layer_case(lc);
      const ref::LayerConfig& c = lc.config;
      const ref::LayerStages<double> st = ref::layer_forward(c, d.params, d.in);
      const int64_t B = d.in.x.dim(0), T = d.in.x.dim(1), Dc = c.conv_dim();
      // projections: plain loops over the weight rows (q section and beta logits)
      const Tensor<double>& wq = ref::param(d.params, c.fused_in_proj ? "in_proj.weight" : "q_proj.weight");
      const Tensor<double>& wb = ref::param(d.params, "beta_proj.weight");
      Tensor<double> qp({B, T, c.qk_dim()}), qs({B, T, c.qk_dim()}), bl({B, T, c.HV});
      for (int64_t r = 0; r < B * T; ++r) {
        for (int64_t o = 0; o < c.qk_dim(); ++o) {
          double s = 0;
          for (int64_t e = 0; e < c.hidden; ++e) s += d.in.x.data()[r * c.hidden + e] * wq.data()[o * c.hidden + e];
          qp.data()[r * c.qk_dim() + o] = s;
          qs.data()[r * c.qk_dim() + o] = st.qkv_proj.data()[r * Dc + o];
        }
        for (int64_t o = 0; o < c.HV; ++o) {
          double s = 0;
          for (int64_t e = 0; e < c.hidden; ++e) s += d.in.x.data()[r * c.hidden + e] * wb.data()[o * c.hidden + e];
          bl.data()[r * c.HV + o] = s;
        }
      }
      double worst = std::max(rel(qp, qs), rel(bl, st.beta_logit));
      // conv1d
      Tensor<double> conv({B, T, Dc});
      const auto cw = ref::param(d.params, "conv1d.weight").view();
      const TensorView cb = c.conv_bias ? ref::param(d.params, "conv1d.bias").view() : TensorView{};
      const auto cp = ref::make_conv1d_problem(st.qkv_proj.view(), cw, cb, d.in.cu_seqlens, true, {});
      ref::conv1d_forward(cp, st.qkv_proj.view(), cw, cb, {}, conv.view());
      worst = std::max(worst, rel(conv, st.qkv_conv));
      // L2 norm of q: loop per (token, head)
      Tensor<double> q({B, T, c.H, c.K});
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t h = 0; h < c.H; ++h) {
          double s = 0;
          for (int64_t i = 0; i < c.K; ++i) s += std::pow(conv.data()[r * Dc + h * c.K + i], 2);
          for (int64_t i = 0; i < c.K; ++i)
            q.data()[(r * c.H + h) * c.K + i] = conv.data()[r * Dc + h * c.K + i] / std::sqrt(s + c.l2norm_eps);
        }
      worst = std::max(worst, rel(q, st.q));
      // the kernel on the stage tensors
      ProblemOptions opt;
      opt.cu_seqlens = d.in.cu_seqlens, opt.chunk_size = c.chunk_size;
      const Inputs kin{st.q.view(), st.k.view(), st.v.view(), st.g.view(), st.beta.view(),
                       ref::param(d.params, "A_log").view(), ref::param(d.params, "dt_bias").view(),
                       d.in.initial_state.view()};
      const Problem kp = make_problem(c.variant, kin, ref::layer_kernel_flags(c), opt);
      Tensor<double> o(st.o.shape()), ht(st.final_state.shape());
      ref::make_cpu_backend(ref::CpuAlgorithm::recurrent)->forward(kp, kin, Outputs{o.view(), ht.view()});
      worst = std::max({worst, rel(o, st.o), rel(ht, st.final_state)});
      // gated RMSNorm and output projection: loops
      Tensor<double> y(st.y.shape()), out({B, T, c.hidden});
      const Tensor<double>& nw = ref::param(d.params, "out_norm.weight");
      for (int64_t r = 0; r < B * T * c.HV; ++r) {
        double ms = 0;
        for (int64_t j = 0; j < c.V; ++j) ms += std::pow(o.data()[r * c.V + j], 2) / double(c.V);
        for (int64_t j = 0; j < c.V; ++j) {
          const double z = st.gate.data()[r * c.V + j], sg = 1 / (1 + std::exp(-z));
          const double act = c.output_gate == ref::OutputGate::sigmoid ? sg : z * sg;
          y.data()[r * c.V + j] = o.data()[r * c.V + j] / std::sqrt(ms + c.norm_eps) * nw.data()[j] * act;
        }
      }
      const Tensor<double>& wo = ref::param(d.params, "out_proj.weight");
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t e = 0; e < c.hidden; ++e) {
          double s = 0;
          for (int64_t j = 0; j < c.v_dim(); ++j) s += y.data()[r * c.v_dim() + j] * wo.data()[e * c.v_dim() + j];
          out.data()[r * c.hidden + e] = s;
        }
      worst = std::max({worst, rel(y, st.y), rel(out, st.out)});
      std::printf("layer vs stages %s: worst rel_l2 %.2e\n", lc.name().c_str(), worst);
      CHECK(worst < val::tol::kIdentityF64);
    }
  }
}
