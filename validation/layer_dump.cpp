// Reading and writing the /layer section (layer_dump.h).
#include "validation/layer_dump.h"

#include <cmath>
#include <limits>

namespace kcp::val {
namespace {

// Tensors with a token axis (stored [T,B,..] under layout SBHD).
bool has_token_axis(const std::string& n) {
  if (n == "x" || n == "dout" || n == "dx" || n == "out") return true;
  for (const LayerStageName& s : layer_stage_names())
    if (n == s.tensor || n == "d" + std::string(s.tensor)) return std::string(s.tensor) != "final_state";
  return false;
}

std::string canonical(const std::string& n) {
  static const std::map<std::string, std::string> alias = {{"hidden_in", "x"},       {"core_attn_out", "o"},
                                                           {"conv_out", "qkv_conv"}, {"beta_proj_out", "beta_logit"},
                                                           {"dhidden_in", "dx"}};
  const auto it = alias.find(n);
  return it == alias.end() ? n : it->second;
}

Tensor<double> swap_first_axes(const Tensor<double>& t) {
  Shape s = t.shape();
  std::swap(s[0], s[1]);
  Tensor<double> r(s);
  const int64_t A = t.dim(0), B = t.dim(1), row = t.numel() / std::max<int64_t>(1, A * B);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < row; ++i) r.data()[(b * A + a) * row + i] = t.data()[(a * B + b) * row + i];
  return r;
}

ref::LayerConfig read_config(const io::Dump& d, const io::Attributes& a) {
  const std::string w = d.path + ": /layer";
  ref::LayerConfig c;
  c.variant = variant_parse(d.op);
  c.hidden = io::attr_int(a, "hidden", w, 0), c.H = io::attr_int(a, "H", w, 0), c.HV = io::attr_int(a, "HV", w, 0);
  c.K = io::attr_int(a, "K", w, 0), c.V = io::attr_int(a, "V", w, 0);
  c.conv_size = io::attr_int(a, "conv_size", w, 4);
  c.conv_bias = io::attr_flag(a, "conv_bias", w, false);
  c.fused_in_proj = io::attr_flag(a, "fused_in_proj", w, true);
  c.g_lora_rank = io::attr_int(a, "g_lora_rank", w, 0), c.gate_lora_rank = io::attr_int(a, "gate_lora_rank", w, 0);
  c.g_bias = io::attr_flag(a, "g_bias", w, false);
  c.qk_l2norm = io::attr_flag(a, "qk_l2norm", w, true);
  c.l2norm_eps = io::attr_number(a, "l2norm_eps", w, 1e-6);
  const double lb = io::attr_number(a, "lower_bound", w, std::numeric_limits<double>::quiet_NaN());
  if (!std::isnan(lb)) c.lower_bound = lb;
  c.safe_gate = io::attr_flag(a, "safe_gate", w, false);
  const std::string og = io::attr_string(a, "output_gate", w, c.variant == Variant::gdn ? "silu" : "sigmoid");
  KCP_CHECK(og == "sigmoid" || og == "silu", w, " attribute output_gate: expected sigmoid or silu, got '", og, "'");
  c.output_gate = og == "silu" ? ref::OutputGate::silu : ref::OutputGate::sigmoid;
  c.norm_eps = io::attr_number(a, "norm_eps", w, 1e-5);
  const double sc = io::attr_number(a, "scale", w, 0);
  if (sc > 0) c.scale = sc;
  c.pad_multiple = io::attr_int(a, "pad_multiple", w, 0);
  c.chunk_size = io::attr_int(a, "chunk_size", w, 64);
  ref::check_layer_config(c);
  return c;
}

io::Attributes write_config(const ref::LayerConfig& c) {
  io::Attributes a;
  a["layout"] = std::string("BSHD");
  a["hidden"] = c.hidden, a["H"] = c.H, a["HV"] = c.HV, a["K"] = c.K, a["V"] = c.V;
  a["conv_size"] = c.conv_size, a["conv_bias"] = c.conv_bias, a["fused_in_proj"] = c.fused_in_proj;
  a["g_lora_rank"] = c.g_lora_rank, a["gate_lora_rank"] = c.gate_lora_rank, a["g_bias"] = c.g_bias;
  a["qk_l2norm"] = c.qk_l2norm, a["l2norm_eps"] = c.l2norm_eps;
  a["lower_bound"] = c.lower_bound ? *c.lower_bound : std::numeric_limits<double>::quiet_NaN();
  a["safe_gate"] = c.safe_gate;
  a["output_gate"] = std::string(c.output_gate == ref::OutputGate::silu ? "silu" : "sigmoid");
  a["norm_eps"] = c.norm_eps, a["scale"] = c.scale ? *c.scale : 1 / std::sqrt(double(c.K));
  a["pad_multiple"] = c.pad_multiple, a["chunk_size"] = c.chunk_size;
  return a;
}

void put(io::DumpGroup& g, const std::string& name, const Tensor<double>& t, DType stored) {
  if (t.empty()) return;
  io::Array a = io::array_from_view(t.view());
  if (stored != DType::f64) a = io::array_convert(a, stored);
  g.add(name, std::move(a), stored, stored == DType::bf16 ? io::Encoding::bf16_float : io::Encoding::ieee);
}

}  // namespace

const std::vector<LayerStageName>& layer_stage_names() {
  static const std::vector<LayerStageName> s = {
      {"qkv_proj", "in_proj"}, {"g", "gate:g"},           {"gate", "out_gate:proj"}, {"beta_logit", "gate:beta"},
      {"qkv_conv", "conv"},    {"v", "conv"},             {"q", "qk_norm"},          {"k", "qk_norm"},
      {"beta", "gate:beta"},   {"a", "gate:decay"},       {"o", "kernel"},           {"final_state", "kernel"},
      {"norm_out", "out_norm"}, {"y", "out_gate"},        {"out", "out_proj"}};
  return s;
}

std::vector<std::pair<std::string, const Tensor<double>*>> layer_stage_grads(const ref::LayerGrads<double>& g) {
  const ref::LayerStages<double>& s = g.dstages;
  return {{"dqkv_proj", &s.qkv_proj}, {"dg", &s.g},       {"dgate", &s.gate}, {"dbeta_logit", &s.beta_logit},
          {"dqkv_conv", &s.qkv_conv}, {"dq", &s.q},       {"dk", &s.k},       {"dv", &s.v},
          {"dbeta", &s.beta},         {"do", &s.o},       {"dy", &s.y}};
}

bool is_layer_dump(const io::Dump& d) {
  return io::attr_string(d.attrs, "capture_point", d.path + ":", "") == "layer" && d.group("layer");
}

LayerDumpCall read_layer_call(const io::Dump& d) {
  const io::DumpGroup* lg = d.group("layer");
  KCP_CHECK(lg, d.path, ": /layer: missing (capture_point = layer)");
  LayerDumpCall c;
  c.config = read_config(d, lg->attrs);
  const std::string layout = io::attr_string(lg->attrs, "layout", d.path + ": /layer", "BSHD");
  KCP_CHECK(layout == "BSHD" || layout == "SBHD", d.path, ": /layer attribute layout: expected BSHD or SBHD, got '",
            layout, "'");
  for (const io::DumpDataset& ds : lg->datasets) {
    const std::string n = canonical(ds.name);
    if (n == "cu_seqlens") {
      const Tensor<int64_t> cu = to_tensor<int64_t>(ds.data.view());
      c.in.cu_seqlens.assign(cu.data(), cu.data() + cu.numel());
      continue;
    }
    Tensor<double> t = to_tensor<double>(ds.data.view());
    if (layout == "SBHD" && has_token_axis(n) && t.shape().size() >= 2) t = swap_first_axes(t);
    if (n == "x") c.in.x = std::move(t);
    else if (n == "initial_state") c.in.initial_state = std::move(t);
    else if (n == "dout") c.dout = std::move(t);
    else if (n == "dht") c.dht = std::move(t);
    else c.found[n] = std::move(t), c.stored[n] = ds.source;
  }
  KCP_CHECK(!c.in.x.empty(), d.path, ": /layer/x: missing (the layer input)");
  const io::DumpGroup* pg = d.group("layer/params");
  KCP_CHECK(pg, d.path, ": /layer/params: missing (the weights)");
  for (const ref::ParamSpec& ps : ref::layer_param_specs(c.config)) {
    const io::DumpDataset* ds = pg->find(ps.name);
    KCP_CHECK(ds, d.path, ": /layer/params/", ps.name, ": missing (", c.config.describe(), " has it)");
    Tensor<double> t = to_tensor<double>(ds->data.view());
    KCP_CHECK(t.shape() == ps.shape, d.path, ": /layer/params/", ps.name, ": shape ", shape_str(t.shape()),
              ", expected ", shape_str(ps.shape));
    c.params[ps.name] = std::move(t);
  }
  if (const io::DumpGroup* gg = d.group("layer/grads"))
    for (const io::DumpDataset& ds : gg->datasets)
      c.found["grads/" + ds.name] = to_tensor<double>(ds.data.view()), c.stored["grads/" + ds.name] = ds.source;
  return c;
}

io::Dump layer_dump(const LayerCaseData& d, const ref::LayerStages<double>& st, const ref::LayerGrads<double>* gr,
                    DType stored, const std::string& source) {
  io::Dump out;
  out.op = std::string(variant_name(d.spec.config.variant));
  out.attrs["format"] = std::string(io::kDumpFormat);
  out.attrs["format_version"] = io::kDumpVersion;
  out.attrs["op"] = out.op;
  out.attrs["capture_point"] = std::string("layer");
  out.attrs["source_framework"] = source;
  out.attrs["case"] = d.spec.name();
  out.attrs["seed"] = int64_t(d.spec.seed);
  io::DumpGroup lg, pg, gg;  // filled here, added at the end (add_group may move earlier groups)
  lg.name = "layer", pg.name = "layer/params", gg.name = "layer/grads";
  lg.attrs = write_config(d.spec.config);
  put(lg, "x", d.in.x, stored);
  if (!d.in.cu_seqlens.empty()) {
    Tensor<int64_t> cu({int64_t(d.in.cu_seqlens.size())});
    for (size_t i = 0; i < d.in.cu_seqlens.size(); ++i) cu.data()[i] = d.in.cu_seqlens[i];
    lg.add("cu_seqlens", io::array_from_view(cu.view()), DType::i64);
  }
  put(lg, "initial_state", d.in.initial_state, DType::f64);
  put(lg, "dout", d.dout, stored);
  put(lg, "dht", d.dht, DType::f64);
  const std::map<std::string, const Tensor<double>*> stages = {
      {"qkv_proj", &st.qkv_proj}, {"g", &st.g},   {"gate", &st.gate},         {"beta_logit", &st.beta_logit},
      {"qkv_conv", &st.qkv_conv}, {"q", &st.q},   {"k", &st.k},               {"v", &st.v},
      {"beta", &st.beta},         {"a", &st.a},   {"o", &st.o},               {"norm_out", &st.norm_out},
      {"y", &st.y},               {"out", &st.out}, {"final_state", &st.final_state}};
  for (const auto& [name, t] : stages) put(lg, name, *t, stored);
  for (const auto& [name, t] : d.params) put(pg, name, t, stored);
  if (gr) {
    put(lg, "dx", gr->dx, stored);
    for (const auto& [name, t] : layer_stage_grads(*gr)) put(lg, name, *t, stored);
    for (const auto& [name, t] : gr->dparams) put(gg, name, t, stored);
  }
  out.groups.push_back(std::move(lg));
  out.groups.push_back(std::move(pg));
  if (gr) out.groups.push_back(std::move(gg));
  return out;
}

}  // namespace kcp::val
