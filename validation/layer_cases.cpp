// Named, seeded layer cases (layer_cases.h).
#include "validation/layer_cases.h"

#include <cmath>
#include <sstream>

#include "core/rng.h"

namespace kcp::val {

std::string LayerCase::name() const {
  std::ostringstream s;
  int64_t total = 0;
  for (int64_t L : seqlens) total += L;
  s << tag << ":" << config.describe() << ",B=" << B << ",T=" << (seqlens.empty() ? T : total);
  if (!seqlens.empty()) {
    s << ",seqlens=";
    for (size_t i = 0; i < seqlens.size(); ++i) s << (i ? "+" : "") << seqlens[i];
  }
  if (initial_state) s << ",h0";
  if (final_state) s << ",ht";
  s << ",seed=" << seed;
  return s.str();
}

namespace {

Tensor<double> normal(const Shape& s, uint64_t seed, uint64_t stream) {
  Tensor<double> t(s);
  const CounterRng rng{seed, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.normal(uint64_t(i));
  return t;
}

}  // namespace

LayerCaseData make_layer_case(const LayerCase& c) {
  LayerCaseData d;
  d.spec = c;
  const ref::LayerConfig& cf = c.config;
  d.params = ref::layer_init_params(cf, c.seed);
  // MaxText's gate init (dt_bias ~ -5, exp(A_log) ~ 8) saturates the lower-bound gate (sigmoid(-40)):
  // its gradients are ~1e-13 and finite differences see only rounding. The cases draw the gate
  // parameters where the gate is sensitive instead: A_log = log U(0.5, 2), dt_bias ~ N(0, 0.5^2).
  const CounterRng ra{c.seed, 90}, rd{c.seed, 91};
  for (int64_t i = 0; i < d.params["A_log"].numel(); ++i)
    d.params["A_log"].data()[i] = std::log(ra.uniform(uint64_t(i), 0.5, 2));
  for (int64_t i = 0; i < d.params["dt_bias"].numel(); ++i) d.params["dt_bias"].data()[i] = 0.5 * rd.normal(uint64_t(i));
  int64_t B = c.B, T = c.T, N = c.B;
  if (!c.seqlens.empty()) {
    B = 1, T = 0, N = int64_t(c.seqlens.size());
    d.in.cu_seqlens.push_back(0);
    for (int64_t L : c.seqlens) d.in.cu_seqlens.push_back(T += L);
    d.spec.B = 1, d.spec.T = T;
  }
  d.in.x = normal({B, T, cf.hidden}, c.seed, 1);
  if (c.initial_state) d.in.initial_state = normal({N, cf.HV, cf.K, cf.V}, c.seed, 2);
  d.dout = normal({B, T, cf.hidden}, c.seed, 3);
  if (c.final_state) d.dht = normal({N, cf.HV, cf.K, cf.V}, c.seed, 4);
  return d;
}

double layer_loss(const LayerCaseData& d, const ref::LayerStages<double>& st) {
  double L = 0;
  for (int64_t i = 0; i < st.out.numel(); ++i) L += st.out.data()[i] * d.dout.data()[i];
  for (int64_t i = 0; i < d.dht.numel(); ++i) L += st.final_state.data()[i] * d.dht.data()[i];
  return L;
}

std::vector<LayerCase> named_layer_cases(uint64_t seed) {
  ref::LayerConfig kda;  // Megatron KDA: fused in_proj, lower-bound gate with safe_gate, sigmoid output gate
  kda.variant = Variant::kda, kda.hidden = 8, kda.H = 2, kda.HV = 2, kda.K = 4, kda.V = 4;
  kda.lower_bound = -5.0, kda.safe_gate = true;
  std::vector<LayerCase> cs;
  cs.push_back({"kda-megatron", kda, 1, 0, {5, 8}, false, true, seed});
  ref::LayerConfig lora = kda;  // MaxText-style split projections, LoRA g and gate, biases, softplus gate
  lora.fused_in_proj = false, lora.g_lora_rank = 3, lora.gate_lora_rank = 2, lora.g_bias = true;
  lora.conv_bias = true, lora.lower_bound.reset(), lora.safe_gate = false, lora.H = 1, lora.HV = 2;
  cs.push_back({"kda-split-lora", lora, 2, 7, {}, true, true, seed + 1});
  ref::LayerConfig fused_lora = kda;  // fused in_proj without the LoRA'd g section
  fused_lora.g_lora_rank = 2, fused_lora.conv_size = 3;
  cs.push_back({"kda-fused-lora", fused_lora, 1, 9, {}, false, true, seed + 2});
  ref::LayerConfig gdn = kda;  // Megatron GDN: scalar gate, softplus, silu output gate
  gdn.variant = Variant::gdn, gdn.lower_bound.reset(), gdn.safe_gate = false;
  gdn.output_gate = ref::OutputGate::silu, gdn.H = 1, gdn.HV = 2;
  cs.push_back({"gdn-megatron", gdn, 1, 0, {4, 1, 6}, true, true, seed + 3});
  ref::LayerConfig chunk = kda;  // the chunkwise kernel inside the layer, two chunks of 16
  chunk.kernel = ref::CpuAlgorithm::chunkwise, chunk.chunk_size = 16;
  cs.push_back({"kda-chunkwise", chunk, 1, 21, {}, false, true, seed + 4});
  ref::LayerConfig pad = kda;  // MaxText: T padded to a multiple of 64 (no final state: it sees the pad)
  pad.pad_multiple = 64;
  cs.push_back({"kda-maxtext-pad", pad, 2, 10, {}, false, false, seed + 5});
  return cs;
}

}  // namespace kcp::val
