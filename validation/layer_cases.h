// Seeded layer problems (reference/layer.h): a LayerCase names a config, the batch shape, packed
// sequences and seed; make_layer_case() draws x ~ N(0,1), the weights (layer_init_params, with the
// gate parameters A_log = log U(0.5,2), dt_bias ~ N(0,0.25) where the gate is sensitive), an
// initial state and the cotangents dout, dht ~ N(0,1) from the counter RNG, so a case is rebuilt
// from its printed name alone. named_layer_cases() is the list the tests, `kcp layer-demo` and the
// layer CP sweep share.
// Covered by tests/reference/test_layer.cpp.
#pragma once

#include <string>
#include <vector>

#include "reference/layer.h"

namespace kcp::val {

struct LayerCase {
  std::string tag;                 // short label: "kda-megatron", "kda-maxtext-lora", ...
  ref::LayerConfig config;
  int64_t B = 1, T = 16;
  std::vector<int64_t> seqlens;    // non-empty: packed (B = 1, T = sum)
  bool initial_state = false;      // give h0
  bool final_state = true;         // dht in the loss
  uint64_t seed = 0;
  std::string name() const;        // "kda-megatron:kda-layer(...),B=1,T=13,seqlens=5+8,seed=3"
};

struct LayerCaseData {
  LayerCase spec;
  ref::LayerParams<double> params;
  ref::LayerInputs<double> in;
  Tensor<double> dout, dht;        // [B,T,hidden]; [N,HV,K,V] or empty
};
LayerCaseData make_layer_case(const LayerCase& c);

// Small cases covering every option: fused / split projections, LoRA, g and conv biases, both gate
// forms, GVA, packed sequences, initial state, MaxText padding, gdn, both kernels.
std::vector<LayerCase> named_layer_cases(uint64_t seed);

// sum(out * dout) + sum(final_state * dht): the scalar the layer backward differentiates.
double layer_loss(const LayerCaseData& d, const ref::LayerStages<double>& st);

}  // namespace kcp::val
