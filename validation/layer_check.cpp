// layer_check(): the oracle run and the pairing of layer_check.h.
#include "validation/layer_check.h"

#include <map>

#include "validation/tolerance.h"

namespace kcp::val {

Bar layer_bar(DType stored) {
  switch (stored) {
    case DType::f64: return {tol::kLayerF64, false, false, "float64 producer: rounding order only"};
    case DType::f32: return {tol::kLayerF32, false, false, "float32 producer through the layer's stages"};
    case DType::f16: return {tol::kLayerF16, false, false, "float16 storage between stages"};
    default: return {tol::kLayerBf16, false, false, "bfloat16 storage between stages"};
  }
}

namespace {

void add_pair(LayerCheck& lc, const LayerDumpCall& c, const std::string& tensor, const std::string& stage,
              const Tensor<double>& oracle) {
  const auto it = c.found.find(tensor);
  if (it == c.found.end()) return;
  LayerPair p;
  p.tensor = tensor, p.stage = stage, p.candidate = it->second, p.stored = c.stored.at(tensor);
  p.bar = layer_bar(p.stored);
  if (oracle.shape() != p.candidate.shape())
    p.problem = "shape " + shape_str(p.candidate.shape()) + ", the oracle's is " + shape_str(oracle.shape());
  else
    p.oracle = oracle;
  lc.pairs.push_back(std::move(p));
}

const Tensor<double>& stage_tensor(const ref::LayerStages<double>& s, const std::string& n) {
  const std::map<std::string, const Tensor<double>*> m = {
      {"qkv_proj", &s.qkv_proj}, {"g", &s.g},   {"gate", &s.gate},               {"beta_logit", &s.beta_logit},
      {"qkv_conv", &s.qkv_conv}, {"q", &s.q},   {"k", &s.k},                     {"v", &s.v},
      {"beta", &s.beta},         {"a", &s.a},   {"final_state", &s.final_state}, {"o", &s.o},
      {"norm_out", &s.norm_out}, {"y", &s.y},   {"out", &s.out}};
  return *m.at(n);
}

}  // namespace

const std::vector<LayerStageName>& layer_backward_names() {
  static const std::vector<LayerStageName> s = {
      {"dy", "out_proj bwd"},          {"grads/out_proj.weight", "out_proj bwd"},
      {"do", "out_gate bwd"},          {"dgate", "out_gate bwd"},
      {"grads/out_norm.weight", "out_gate bwd"},
      {"grads/gate_proj.weight", "out_gate:proj bwd"}, {"grads/gate_proj.lora_a", "out_gate:proj bwd"},
      {"grads/gate_proj.lora_b", "out_gate:proj bwd"},
      {"dq", "kernel bwd"},            {"dk", "kernel bwd"},       {"dv", "kernel bwd"},
      {"dg", "kernel bwd"},            {"dbeta", "kernel bwd"},    {"grads/A_log", "kernel bwd"},
      {"grads/dt_bias", "kernel bwd"},
      {"dbeta_logit", "gate:beta bwd"}, {"grads/beta_proj.weight", "gate:beta bwd"},
      {"grads/g_proj.weight", "gate:g bwd"}, {"grads/g_proj.lora_a", "gate:g bwd"},
      {"grads/g_proj.lora_b", "gate:g bwd"}, {"grads/g_proj.bias", "gate:g bwd"},
      {"dqkv_conv", "qk_norm bwd"},
      {"dqkv_proj", "conv bwd"},       {"grads/conv1d.weight", "conv bwd"}, {"grads/conv1d.bias", "conv bwd"},
      {"dx", "in_proj bwd"},           {"grads/in_proj.weight", "in_proj bwd"},
      {"grads/q_proj.weight", "in_proj bwd"}, {"grads/k_proj.weight", "in_proj bwd"},
      {"grads/v_proj.weight", "in_proj bwd"}};
  return s;
}

std::string layer_check_description(const LayerDumpCall& c) {
  return c.config.describe() + " x " + shape_str(c.in.x.shape()) +
         (c.in.cu_seqlens.empty() ? "" : " packed N=" + std::to_string(c.in.cu_seqlens.size() - 1));
}

LayerCheck layer_check(const LayerDumpCall& c) {
  LayerCheck lc;
  lc.description = layer_check_description(c);
  const ref::LayerStages<double> st = ref::layer_forward(c.config, c.params, c.in);
  for (const LayerStageName& s : layer_stage_names()) add_pair(lc, c, s.tensor, s.stage, stage_tensor(st, s.tensor));
  if (c.dout.empty()) return lc;
  const ref::LayerGrads<double> g = ref::layer_backward(c.config, c.params, c.in, c.dout, c.dht);
  std::map<std::string, const Tensor<double>*> oracle = {{"dx", &g.dx}};
  for (const auto& [name, t] : layer_stage_grads(g)) oracle[name] = t;
  for (const auto& [name, t] : g.dparams) oracle["grads/" + name] = &t;
  for (const LayerStageName& s : layer_backward_names())
    if (oracle.count(s.tensor)) add_pair(lc, c, s.tensor, s.stage, *oracle.at(s.tensor));
  return lc;
}

int layer_first_departure(const LayerCheck& lc) {
  for (size_t i = 0; i < lc.pairs.size(); ++i) {
    const LayerPair& p = lc.pairs[i];
    if (!p.problem.empty() || judge(compare(p.candidate.view(), p.oracle.view()), p.bar) == Verdict::fail)
      return int(i);
  }
  return -1;
}

}  // namespace kcp::val
