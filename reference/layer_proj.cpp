// Input projections of the layer and their backward (layer_proj.h), plus the weight table:
// names and shapes (layer_param_specs), the config check and seeded initialisation.
#include "reference/layer_proj.h"

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"

namespace kcp::ref {

std::string LayerConfig::describe() const {
  std::ostringstream s;
  s << variant_name(variant) << "-layer(hidden=" << hidden << ",H=" << H << ",HV=" << HV << ",K=" << K << ",V=" << V
    << ",W=" << conv_size << (fused_in_proj ? ",fused" : ",split");
  if (g_lora_rank) s << ",g_lora=" << g_lora_rank;
  if (gate_lora_rank) s << ",gate_lora=" << gate_lora_rank;
  if (conv_bias) s << ",conv_bias";
  if (g_bias) s << ",g_bias";
  if (lower_bound) s << ",lb=" << *lower_bound << (safe_gate ? ",safe_gate" : "");
  if (pad_multiple) s << ",pad=" << pad_multiple;
  s << (kernel == CpuAlgorithm::recurrent ? ",recurrent" : ",chunkwise") << ")";
  return s.str();
}

void check_layer_config(const LayerConfig& c) {
  KCP_CHECK(c.variant != Variant::gla, "layer: variant must be kda or gdn");
  KCP_CHECK(c.hidden > 0 && c.H > 0 && c.HV > 0 && c.K > 0 && c.V > 0, "layer: hidden, H, HV, K, V must be > 0");
  KCP_CHECK(c.HV % c.H == 0, "layer: HV = ", c.HV, " is not a multiple of H = ", c.H);
  KCP_CHECK(c.conv_size >= 1, "layer: conv_size must be >= 1");
  KCP_CHECK(c.g_lora_rank >= 0 && c.gate_lora_rank >= 0, "layer: LoRA ranks must be >= 0");
  KCP_CHECK(!c.lower_bound || c.variant == Variant::kda, "layer: lower_bound is a kda gate");
  KCP_CHECK(c.pad_multiple >= 0, "layer: pad_multiple must be >= 0");
}

std::vector<ParamSpec> layer_param_specs(const LayerConfig& c) {
  check_layer_config(c);
  std::vector<ParamSpec> s;
  const int64_t hd = c.hidden;
  if (c.fused_in_proj) {
    const int64_t rows = c.conv_dim() + (c.g_lora_rank ? 0 : c.g_dim()) + (c.gate_lora_rank ? 0 : c.v_dim());
    s.push_back({"in_proj.weight", {rows, hd}});
  } else {
    s.push_back({"q_proj.weight", {c.qk_dim(), hd}});
    s.push_back({"k_proj.weight", {c.qk_dim(), hd}});
    s.push_back({"v_proj.weight", {c.v_dim(), hd}});
    if (!c.g_lora_rank) s.push_back({"g_proj.weight", {c.g_dim(), hd}});
    if (!c.gate_lora_rank) s.push_back({"gate_proj.weight", {c.v_dim(), hd}});
  }
  if (c.g_lora_rank) {
    s.push_back({"g_proj.lora_a", {c.g_lora_rank, hd}});
    s.push_back({"g_proj.lora_b", {c.g_dim(), c.g_lora_rank}});
  }
  if (c.g_bias) s.push_back({"g_proj.bias", {c.g_dim()}});
  if (c.gate_lora_rank) {
    s.push_back({"gate_proj.lora_a", {c.gate_lora_rank, hd}});
    s.push_back({"gate_proj.lora_b", {c.v_dim(), c.gate_lora_rank}});
  }
  s.push_back({"beta_proj.weight", {c.HV, hd}});
  s.push_back({"conv1d.weight", {c.conv_dim(), c.conv_size}});
  if (c.conv_bias) s.push_back({"conv1d.bias", {c.conv_dim()}});
  s.push_back({"A_log", {c.HV}});
  s.push_back({"dt_bias", {c.g_dim()}});
  s.push_back({"out_norm.weight", {c.V}});
  s.push_back({"out_proj.weight", {hd, c.v_dim()}});
  return s;
}

LayerParams<double> layer_init_params(const LayerConfig& c, uint64_t seed) {
  LayerParams<double> w;
  uint64_t stream = 100;
  for (const ParamSpec& ps : layer_param_specs(c)) {
    Tensor<double> t(ps.shape);
    const CounterRng rng{seed, stream++};
    const double fan_in = ps.shape.size() == 2 ? double(ps.shape[1]) : 1.0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double& v = t.data()[i];
      if (ps.name == "A_log") {
        v = std::log(rng.uniform(uint64_t(i), 1, 16));
      } else if (ps.name == "dt_bias") {
        const double dt = std::max(1e-4, std::exp(rng.uniform(uint64_t(i), std::log(1e-3), std::log(0.1))));
        v = dt + std::log(-std::expm1(-dt));  // inverse softplus
      } else if (ps.name == "out_norm.weight") {
        v = 1 + 0.1 * rng.normal(uint64_t(i));
      } else if (ps.name == "conv1d.bias" || ps.name == "g_proj.bias") {
        v = 0.1 * rng.normal(uint64_t(i));
      } else {
        v = rng.normal(uint64_t(i)) / std::sqrt(fan_in);
      }
    }
    w[ps.name] = std::move(t);
  }
  return w;
}

template <class D, class S>
LayerParams<D> layer_params_cast(const LayerParams<S>& p) {
  LayerParams<D> r;
  for (const auto& [name, t] : p) {
    Tensor<D> d(t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) d.data()[i] = D(t.data()[i]);
    r[name] = std::move(d);
  }
  return r;
}
template LayerParams<float> layer_params_cast<float, double>(const LayerParams<double>&);
template LayerParams<double> layer_params_cast<double, double>(const LayerParams<double>&);
template LayerParams<double> layer_params_cast<double, float>(const LayerParams<float>&);

template <class S>
const Tensor<S>& param(const LayerParams<S>& w, const std::string& name) {
  const auto it = w.find(name);
  KCP_CHECK(it != w.end(), "layer: weight '", name, "' is missing");
  return it->second;
}

template <class S>
Mat<S> tensor_rows(const Tensor<S>& t, int64_t cols) {
  return Eigen::Map<const Mat<S>>(t.data(), cols ? t.numel() / cols : 0, cols);
}
template <class S>
Tensor<S> rows_tensor(const Mat<S>& m, const Shape& shape) {
  Tensor<S> t(shape);
  KCP_CHECK(t.numel() == m.size(), "layer: ", m.rows(), "x", m.cols(), " rows do not fill ", shape_str(shape));
  Eigen::Map<Mat<S>>(t.data(), m.rows(), m.cols()) = m;
  return t;
}
template <class S>
void add_rows(Tensor<S>& t, const Mat<S>& m) {
  KCP_CHECK(t.numel() == m.size(), "layer: gradient of ", shape_str(t.shape()), " gets ", m.size(), " elements");
  Eigen::Map<Mat<S>>(t.data(), m.rows(), m.cols()) += m;
}

namespace {

// A LoRA pair: y = (x A^T) B^T.
template <class S>
Mat<S> lora(const LayerParams<S>& w, const std::string& base, const Mat<S>& x) {
  const Tensor<S>& a = param(w, base + ".lora_a");
  const Tensor<S>& b = param(w, base + ".lora_b");
  return linear_forward<S>(linear_forward<S>(x, tensor_rows(a, a.dim(1))), tensor_rows(b, b.dim(1)));
}
template <class S>
void lora_backward(const LayerParams<S>& w, const std::string& base, const Mat<S>& x, const Mat<S>& dy, Mat<S>* dx,
                   LayerParams<S>* dw) {
  const Mat<S> a = tensor_rows(param(w, base + ".lora_a"), x.cols());
  const Mat<S> b = tensor_rows(param(w, base + ".lora_b"), a.rows());
  const Mat<S> h = linear_forward<S>(x, a);
  Mat<S> dh = Mat<S>::Zero(h.rows(), h.cols()), da = Mat<S>::Zero(a.rows(), a.cols()),
         db = Mat<S>::Zero(b.rows(), b.cols());
  linear_backward<S>(h, b, dy, &dh, &db);
  linear_backward<S>(x, a, dh, dx, &da);
  add_rows((*dw)[base + ".lora_a"], da);
  add_rows((*dw)[base + ".lora_b"], db);
}
template <class S>
Mat<S> weight(const LayerParams<S>& w, const std::string& name) {
  const Tensor<S>& t = param(w, name);
  return tensor_rows(t, t.dim(1));
}

}  // namespace

template <class S>
Projected<S> project(const LayerConfig& c, const LayerParams<S>& w, const Mat<S>& x, bool qkv_only) {
  Projected<S> p;
  const bool g_in = !c.g_lora_rank, gate_in = !c.gate_lora_rank;
  if (c.fused_in_proj) {
    Mat<S> wi = weight(w, "in_proj.weight");
    if (qkv_only) wi = Mat<S>(wi.topRows(c.conv_dim()));
    const Mat<S> z = linear_forward<S>(x, wi);
    p.qkv = z.leftCols(c.conv_dim());
    if (!qkv_only && g_in) p.g = z.middleCols(c.conv_dim(), c.g_dim());
    if (!qkv_only && gate_in) p.gate = z.rightCols(c.v_dim());
  } else {
    p.qkv.resize(x.rows(), c.conv_dim());
    p.qkv << linear_forward<S>(x, weight(w, "q_proj.weight")), linear_forward<S>(x, weight(w, "k_proj.weight")),
        linear_forward<S>(x, weight(w, "v_proj.weight"));
    if (!qkv_only && g_in) p.g = linear_forward<S>(x, weight(w, "g_proj.weight"));
    if (!qkv_only && gate_in) p.gate = linear_forward<S>(x, weight(w, "gate_proj.weight"));
  }
  if (qkv_only) return p;
  if (!g_in) p.g = lora(w, "g_proj", x);
  if (c.g_bias) p.g.rowwise() += tensor_rows(param(w, "g_proj.bias"), c.g_dim()).row(0);
  if (!gate_in) p.gate = lora(w, "gate_proj", x);
  p.b = linear_forward<S>(x, weight(w, "beta_proj.weight"));
  return p;
}

template <class S>
void project_backward(const LayerConfig& c, const LayerParams<S>& w, const Mat<S>& x, const Projected<S>& dp,
                      Mat<S>* dx, LayerParams<S>* dw) {
  const bool g_in = !c.g_lora_rank, gate_in = !c.gate_lora_rank, has_g = dp.g.size() > 0, has_gate = dp.gate.size() > 0;
  const auto split = [&](const std::string& name, const Mat<S>& dy) {
    Mat<S> d = Mat<S>::Zero(param(w, name).dim(0), x.cols());
    linear_backward<S>(x, weight(w, name), dy, dx, &d);
    add_rows((*dw)[name], d);
  };
  if (c.fused_in_proj) {
    const Mat<S> wi = weight(w, "in_proj.weight");
    Mat<S> dz = Mat<S>::Zero(x.rows(), wi.rows());
    dz.leftCols(c.conv_dim()) = dp.qkv;
    if (g_in && has_g) dz.middleCols(c.conv_dim(), c.g_dim()) = dp.g;
    if (gate_in && has_gate) dz.rightCols(c.v_dim()) = dp.gate;
    Mat<S> d = Mat<S>::Zero(wi.rows(), wi.cols());
    linear_backward<S>(x, wi, dz, dx, &d);
    add_rows((*dw)["in_proj.weight"], d);
  } else {
    split("q_proj.weight", dp.qkv.leftCols(c.qk_dim()));
    split("k_proj.weight", dp.qkv.middleCols(c.qk_dim(), c.qk_dim()));
    split("v_proj.weight", dp.qkv.rightCols(c.v_dim()));
    if (g_in && has_g) split("g_proj.weight", dp.g);
    if (gate_in && has_gate) split("gate_proj.weight", dp.gate);
  }
  if (!g_in && has_g) lora_backward(w, "g_proj", x, dp.g, dx, dw);
  if (c.g_bias && has_g) add_rows((*dw)["g_proj.bias"], Mat<S>(dp.g.colwise().sum()));
  if (!gate_in && has_gate) lora_backward(w, "gate_proj", x, dp.gate, dx, dw);
  if (dp.b.size() > 0) split("beta_proj.weight", dp.b);
}

#define KCP_LAYER_PROJ(S)                                                                                        \
  template const Tensor<S>& param(const LayerParams<S>&, const std::string&);                                   \
  template Mat<S> tensor_rows(const Tensor<S>&, int64_t);                                                       \
  template Tensor<S> rows_tensor(const Mat<S>&, const Shape&);                                                  \
  template void add_rows(Tensor<S>&, const Mat<S>&);                                                            \
  template Projected<S> project(const LayerConfig&, const LayerParams<S>&, const Mat<S>&, bool);                \
  template void project_backward(const LayerConfig&, const LayerParams<S>&, const Mat<S>&, const Projected<S>&, \
                                 Mat<S>*, LayerParams<S>*);
KCP_LAYER_PROJ(double)
KCP_LAYER_PROJ(float)
#undef KCP_LAYER_PROJ

}  // namespace kcp::ref
