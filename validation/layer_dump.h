// The /layer section of a kcp dump (docs/DUMP_FORMAT.md section 7) <-> the layer oracle's call:
//   root:             op = kda | gdn, capture_point = "layer"
//   /layer            attributes: layout ("BSHD", or Megatron's "SBHD": token tensors stored [T,B,..])
//                     and the config (hidden, H, HV, K, V, conv_size, conv_bias, fused_in_proj,
//                     g_lora_rank, gate_lora_rank, g_bias, qk_l2norm, l2norm_eps, lower_bound (NaN:
//                     none), safe_gate, output_gate, norm_eps, scale, pad_multiple, chunk_size)
//   /layer/<name>     x, cu_seqlens, initial_state, dout, dht (inputs and cotangents); the producer's
//                     out, dx and stage captures (names of reference/layer.h's LayerStages), and the
//                     gradients at the stages, "d" + stage name (dq, do, dqkv_conv, ...)
//   /layer/params/<w> the weights (layer_param_specs names);  /layer/grads/<w> their gradients
// Megatron names are read as aliases: hidden_in = x, core_attn_out = o, conv_out = qkv_conv,
// beta_proj_out = beta_logit, dhidden_in = dx.
// Covered by tests/validation/test_layer_dump.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/dump.h"
#include "validation/layer_cases.h"

namespace kcp::val {

// The stage tensors in pipeline order, each with the stage it belongs to ("conv", "qk norm", ...).
struct LayerStageName {
  const char* tensor;
  const char* stage;
};
const std::vector<LayerStageName>& layer_stage_names();

// Everything a dump says about the call, in float64, token tensors in BSHD.
struct LayerDumpCall {
  ref::LayerConfig config;
  ref::LayerParams<double> params;
  ref::LayerInputs<double> in;
  Tensor<double> dout, dht;                     // empty when absent
  std::map<std::string, Tensor<double>> found;  // the producer's tensors: stages, out, dx, grads/<w>
  std::map<std::string, DType> stored;          // the dtype each found tensor was produced in
};
// The gradients at the stages (LayerGrads::dstages) under their dump names: dqkv_proj, dg, dgate,
// dbeta_logit, dqkv_conv, dq, dk, dv, dbeta, do (w.r.t. the kernel output o), dy.
std::vector<std::pair<std::string, const Tensor<double>*>> layer_stage_grads(const ref::LayerGrads<double>& g);

bool is_layer_dump(const io::Dump& d);
LayerDumpCall read_layer_call(const io::Dump& d);

// A layer dump from the oracle (producer stored in `stored`: f64, or f32 / bf16 after rounding the
// oracle's float64 values), with every stage, out, dx and the weight gradients. `stages` and
// `grads` may come from a run with a planted error (reference/layer.h LayerHook).
io::Dump layer_dump(const LayerCaseData& d, const ref::LayerStages<double>& stages,
                    const ref::LayerGrads<double>* grads, DType stored, const std::string& source);

}  // namespace kcp::val
