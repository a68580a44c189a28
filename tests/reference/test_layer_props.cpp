// Properties of the layer oracle (reference/layer.h) that hold exactly in exact arithmetic:
//   - MaxText padding (T -> multiple of 64) leaves outputs and every gradient unchanged and only
//     changes the final state (which then includes the pad tokens);
//   - packed sequences (cu_seqlens) equal each sequence run alone (conv and kernel restart);
//   - the chunkwise kernel inside the layer equals the recurrent one;
//   - a sequence cut in two, the second part given the conv halo rows and the first part's final
//     state (the CP building blocks), equals the whole, gradients included (dx_halo, dh0 sent back);
//   - float32 (the baseline) tracks float64 within tol::kFloatVsDouble.
#include <doctest/doctest.h>

#include <cstdio>

#include "validation/cases.h"
#include "validation/compare.h"
#include "validation/layer_cases.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

double rel(const Tensor<double>& a, const Tensor<double>& b) { return val::compare(a.view(), b.view()).rel_l2; }

double worst_param_rel(const ref::LayerParams<double>& a, const ref::LayerParams<double>& b) {
  double w = 0;
  for (const auto& [name, t] : a) w = std::max(w, rel(t, b.at(name)));
  return w;
}

val::LayerCase find_case(const std::string& tag, uint64_t seed) {
  for (const val::LayerCase& c : val::named_layer_cases(seed))
    if (c.tag == tag) return c;
  throw Error("no layer case " + tag);
}

}  // namespace

TEST_CASE("layer: MaxText padding changes no output or gradient, only the final state") {
  const val::LayerCase lc = find_case("kda-maxtext-pad", val::seed_from_env(5));
  val::LayerCaseData d = val::make_layer_case(lc);
  ref::LayerConfig plain = lc.config;
  plain.pad_multiple = 0;
  const auto st_pad = ref::layer_forward(lc.config, d.params, d.in);
  const auto st = ref::layer_forward(plain, d.params, d.in);
  const auto g_pad = ref::layer_backward(lc.config, d.params, d.in, d.dout, d.dht);
  const auto g = ref::layer_backward(plain, d.params, d.in, d.dout, d.dht);
  const double e_out = rel(st_pad.out, st.out), e_dx = rel(g_pad.dx, g.dx);
  const double e_w = worst_param_rel(g_pad.dparams, g.dparams), e_ht = rel(st_pad.final_state, st.final_state);
  std::printf("layer padding %s: out %.2e dx %.2e dweights %.2e; final state moves by %.2e\n", lc.name().c_str(),
              e_out, e_dx, e_w, e_ht);
  CHECK(e_out < val::tol::kIdentityF64);
  CHECK(e_dx < val::tol::kIdentityF64);
  CHECK(e_w < val::tol::kIdentityF64);
  CHECK(e_ht > 1e-3);  // the pad tokens (x = 0, but conv history, biases, gates) update the state
  // the padded final state is the final state of the layer run on x zero-padded by hand
  ref::LayerInputs<double> padded = d.in;
  padded.x = Tensor<double>({d.in.x.dim(0), 64, plain.hidden});
  for (int64_t b = 0; b < d.in.x.dim(0); ++b)
    for (int64_t i = 0; i < d.in.x.dim(1) * plain.hidden; ++i)
      padded.x.data()[b * 64 * plain.hidden + i] = d.in.x.data()[(b * d.in.x.dim(1)) * plain.hidden + i];
  CHECK(rel(ref::layer_forward(plain, d.params, padded).final_state, st_pad.final_state) < val::tol::kIdentityF64);
  d.in.cu_seqlens = {0, 4, 10};  // packed sequences are rejected with padding, as in MaxText
  d.in.x = Tensor<double>({1, 10, plain.hidden});
  CHECK_THROWS_WITH_AS(ref::layer_forward(lc.config, d.params, d.in), doctest::Contains("dense batches"), Error);
}

TEST_CASE("layer: packed sequences equal the sequences run one by one") {
  const val::LayerCase lc = find_case("kda-megatron", val::seed_from_env(6));
  const val::LayerCaseData d = val::make_layer_case(lc);
  const auto st = ref::layer_forward(lc.config, d.params, d.in);
  const auto g = ref::layer_backward(lc.config, d.params, d.in, d.dout, d.dht);
  ref::LayerParams<double> dsum = ref::layer_params_cast<double, double>(g.dparams);
  for (auto& [name, t] : dsum) t = Tensor<double>(t.shape());
  Tensor<double> out(st.out.shape()), dx(g.dx.shape());
  const int64_t hd = lc.config.hidden, N = int64_t(d.in.cu_seqlens.size()) - 1;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t0 = d.in.cu_seqlens[size_t(n)], L = d.in.cu_seqlens[size_t(n) + 1] - t0;
    ref::LayerInputs<double> one;
    one.x = Tensor<double>({1, L, hd});
    Tensor<double> dout({1, L, hd}), dht({1, lc.config.HV, lc.config.K, lc.config.V});
    for (int64_t i = 0; i < L * hd; ++i) one.x.data()[i] = d.in.x.data()[t0 * hd + i], dout.data()[i] = d.dout.data()[t0 * hd + i];
    for (int64_t i = 0; i < dht.numel(); ++i) dht.data()[i] = d.dht.data()[n * dht.numel() + i];
    const auto st1 = ref::layer_forward(lc.config, d.params, one);
    const auto g1 = ref::layer_backward(lc.config, d.params, one, dout, dht);
    for (int64_t i = 0; i < L * hd; ++i) out.data()[t0 * hd + i] = st1.out.data()[i], dx.data()[t0 * hd + i] = g1.dx.data()[i];
    for (auto& [name, t] : dsum)
      for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] += g1.dparams.at(name).data()[i];
  }
  const double e_out = rel(out, st.out), e_dx = rel(dx, g.dx), e_w = worst_param_rel(dsum, g.dparams);
  std::printf("layer packed vs one by one %s: out %.2e dx %.2e dweights %.2e\n", lc.name().c_str(), e_out, e_dx, e_w);
  CHECK(e_out < val::tol::kIdentityF64);
  CHECK(e_dx < val::tol::kIdentityF64);
  CHECK(e_w < val::tol::kIdentityF64);
}

TEST_CASE("layer: the chunkwise kernel inside the layer equals the recurrent one") {
  const val::LayerCase lc = find_case("kda-chunkwise", val::seed_from_env(7));
  const val::LayerCaseData d = val::make_layer_case(lc);
  ref::LayerConfig rec = lc.config;
  rec.kernel = ref::CpuAlgorithm::recurrent;
  const auto gc = ref::layer_backward(lc.config, d.params, d.in, d.dout, d.dht);
  const auto gr = ref::layer_backward(rec, d.params, d.in, d.dout, d.dht);
  const double e_out = rel(ref::layer_forward(lc.config, d.params, d.in).out, ref::layer_forward(rec, d.params, d.in).out);
  const double e_dx = rel(gc.dx, gr.dx), e_w = worst_param_rel(gc.dparams, gr.dparams);
  std::printf("layer chunkwise vs recurrent: out %.2e dx %.2e dweights %.2e\n", e_out, e_dx, e_w);
  CHECK(e_out < val::tol::kExactF64);
  CHECK(e_dx < val::tol::kExactF64);
  CHECK(e_w < val::tol::kExactF64);
}

TEST_CASE("layer: float32 tracks float64") {
  for (const val::LayerCase& lc : val::named_layer_cases(val::seed_from_env(8))) {
    SUBCASE(lc.name().c_str()) {
      const val::LayerCaseData d = val::make_layer_case(lc);
      const auto w32 = ref::layer_params_cast<float, double>(d.params);
      const auto cast = [](const Tensor<double>& t) {
        if (t.empty()) return Tensor<float>();
        Tensor<float> f(t.shape());
        for (int64_t i = 0; i < t.numel(); ++i) f.data()[i] = float(t.data()[i]);
        return f;
      };
      const auto back = [](const Tensor<float>& t) {
        Tensor<double> r(t.shape());
        for (int64_t i = 0; i < t.numel(); ++i) r.data()[i] = t.data()[i];
        return r;
      };
      ref::LayerInputs<float> in32;
      in32.x = cast(d.in.x), in32.cu_seqlens = d.in.cu_seqlens, in32.initial_state = cast(d.in.initial_state);
      const auto g32 = ref::layer_backward(lc.config, w32, in32, cast(d.dout), cast(d.dht));
      const auto g64 = ref::layer_backward(lc.config, d.params, d.in, d.dout, d.dht);
      const auto st32 = ref::layer_forward(lc.config, w32, in32);
      const auto st64 = ref::layer_forward(lc.config, d.params, d.in);
      const double e_out = rel(back(st32.out), st64.out), e_dx = rel(back(g32.dx), g64.dx);
      double e_w = 0;
      for (const auto& [name, t] : g64.dparams) e_w = std::max(e_w, rel(back(g32.dparams.at(name)), t));
      std::printf("layer float32 vs float64 %s: out %.2e dx %.2e dweights %.2e\n", lc.name().c_str(), e_out, e_dx, e_w);
      CHECK(e_out < val::tol::kFloatVsDouble);
      CHECK(e_dx < val::tol::kFloatVsDouble);
      CHECK(e_w < val::tol::kFloatVsDouble);
    }
  }
}

namespace {

Tensor<double> rows(const Tensor<double>& t, int64_t t0, int64_t n) {  // tokens [t0, t0+n) of [1,T,D]
  const int64_t D = t.dim(2);
  Tensor<double> r({1, n, D});
  for (int64_t i = 0; i < n * D; ++i) r.data()[i] = t.data()[t0 * D + i];
  return r;
}

}  // namespace

TEST_CASE("layer: a sequence cut in two (halo rows + the first part's state) equals the whole, gradients too") {
  val::LayerCase lc = find_case("kda-split-lora", val::seed_from_env(9));
  lc.B = 1, lc.T = 15, lc.initial_state = false, lc.final_state = true;
  const val::LayerCaseData d = val::make_layer_case(lc);
  const ref::LayerConfig& c = lc.config;
  const int64_t T = 15, cut = 9, W = c.conv_size, hd = c.hidden;
  const auto st = ref::layer_forward(c, d.params, d.in);
  const auto g = ref::layer_backward(c, d.params, d.in, d.dout, d.dht);
  ref::LayerInputs<double> a, b;
  a.x = rows(d.in.x, 0, cut);
  const auto sa = ref::layer_forward(c, d.params, a);
  b.x = rows(d.in.x, cut, T - cut);
  b.x_halo = Tensor<double>({W - 1, hd});
  for (int64_t i = 0; i < (W - 1) * hd; ++i) b.x_halo.data()[i] = d.in.x.data()[(cut - (W - 1)) * hd + i];
  b.initial_state = sa.final_state;
  const auto sb = ref::layer_forward(c, d.params, b);
  const auto gb = ref::layer_backward(c, d.params, b, rows(d.dout, cut, T - cut), d.dht);
  const auto ga = ref::layer_backward(c, d.params, a, rows(d.dout, 0, cut), gb.d_initial_state);
  Tensor<double> out({1, T, hd}), dx({1, T, hd});
  for (int64_t i = 0; i < cut * hd; ++i) out.data()[i] = sa.out.data()[i], dx.data()[i] = ga.dx.data()[i];
  for (int64_t i = 0; i < (T - cut) * hd; ++i)
    out.data()[cut * hd + i] = sb.out.data()[i], dx.data()[cut * hd + i] = gb.dx.data()[i];
  for (int64_t i = 0; i < (W - 1) * hd; ++i) dx.data()[(cut - (W - 1)) * hd + i] += gb.dx_halo.data()[i];
  ref::LayerParams<double> dsum = ga.dparams;
  for (auto& [name, t] : dsum)
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] += gb.dparams.at(name).data()[i];
  const double e_out = rel(out, st.out), e_ht = rel(sb.final_state, st.final_state), e_dx = rel(dx, g.dx);
  const double e_w = worst_param_rel(dsum, g.dparams);
  std::printf("layer cut at %lld with halo: out %.2e ht %.2e dx %.2e dweights %.2e\n", (long long)cut, e_out, e_ht,
              e_dx, e_w);
  CHECK(e_out < val::tol::kIdentityF64);
  CHECK(e_ht < val::tol::kIdentityF64);
  CHECK(e_dx < val::tol::kIdentityF64);
  CHECK(e_w < val::tol::kIdentityF64);
}
