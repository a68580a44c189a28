// The KDA / GDN layer as a whole (ALGORITHMS.md section 7; docs/LAYER.md), forward and backward, in
// float64 (the oracle) or float32 (the baseline), composed of the ops of layer_ops.h, the causal
// conv1d (conv1d.h) and the kernel run by a CPU backend (backend_cpu.h):
//   [q|k|v] = x Wqkv^T;  g = x Wg^T (+ bg) or x A^T B^T (LoRA);  gate = x Wgate^T or LoRA;  b = x Wb^T
//   [q|k|v] = silu(conv1d([q|k|v]))                       depthwise causal, width W, per channel
//   q, k    = l2norm(q), l2norm(k) per head               (qk_l2norm; eps 1e-6, outside the kernel)
//   beta    = sigmoid(b)
//   o, ht   = kernel(q, k, v, g, beta, A_log, dt_bias)   in-kernel gate: softplus, or lower_bound
//   y       = rmsnorm_V(o) w_norm * act(gate)             act = sigmoid (KDA) or silu (GDN)
//   out     = y Wo^T
// Shapes: x, out [B,T,hidden]; stages in FLA's bshd; packed sequences with cu_seqlens (B = 1).
// MaxText padding (pad_multiple = 64): x gets zero rows at the end of T, the outputs are cut back;
// real outputs and all gradients are unchanged (causality), the final state includes the pad tokens.
// Weights are torch Linear [out, in] under the names of layer_param_specs().
// Covered by tests/reference/test_layer.cpp.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.h"
#include "core/tensor.h"
#include "reference/backend_cpu.h"
#include "reference/layer_ops.h"

namespace kcp::ref {

struct LayerConfig {
  Variant variant = Variant::kda;  // kda (per-channel gate) or gdn (scalar gate per head)
  int64_t hidden = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t conv_size = 4;           // W
  bool conv_bias = false;
  bool fused_in_proj = true;       // Megatron in_proj [q,k,v,g,gate]; else q/k/v/g/gate_proj
  int64_t g_lora_rank = 0;         // > 0: g = (x A^T) B^T, g_proj.lora_a [r,hidden], lora_b [Dg,r]
  int64_t gate_lora_rank = 0;      // > 0: same for the output gate
  bool g_bias = false;             // MaxText's g_proj bias
  bool qk_l2norm = true;
  double l2norm_eps = 1e-6;        // FLA's l2norm
  std::optional<double> lower_bound;  // set: a = lb sigmoid(exp(A_log)(g + dt_bias)); else softplus
  bool safe_gate = false;          // recorded and passed to the kernel (needs -5 <= lb < 0)
  OutputGate output_gate = OutputGate::sigmoid;
  double norm_eps = 1e-5;          // the output RMSNorm
  std::optional<double> scale;     // default K^-0.5
  int64_t pad_multiple = 0;        // MaxText: 64; 0 = no padding
  int64_t chunk_size = 64;
  CpuAlgorithm kernel = CpuAlgorithm::recurrent;

  int64_t qk_dim() const { return H * K; }
  int64_t v_dim() const { return HV * V; }
  int64_t g_dim() const { return variant == Variant::gdn ? HV : HV * K; }
  int64_t conv_dim() const { return 2 * qk_dim() + v_dim(); }
  std::string describe() const;    // "kda-layer(hidden=8,H=2,HV=2,K=4,V=4,W=4,fused,...)"
};
void check_layer_config(const LayerConfig& c);

struct ParamSpec {
  std::string name;
  Shape shape;
};
// Every weight the config has, in a fixed order (also the order of dumps and FD checks).
std::vector<ParamSpec> layer_param_specs(const LayerConfig& c);

template <class S> using LayerParams = std::map<std::string, Tensor<S>>;

// Seeded weights: projections ~ N(0, 1/hidden), conv ~ N(0, 1/W), MaxText's A_log = log U(1,16),
// dt_bias = inverse softplus of dt = exp(U(log 1e-3, log 0.1)), norm weight 1 + N(0, 0.1).
LayerParams<double> layer_init_params(const LayerConfig& c, uint64_t seed);
template <class D, class S> LayerParams<D> layer_params_cast(const LayerParams<S>& p);

// How the layer runs its kernel. Default (empty functions): the config's CPU backend on the whole
// call. The cp-sweep's layer rows (app/cp_sweep_layer.cpp) substitute cp::ContextParallel on any
// backend (views copied to its device and back); the final state is then not produced (as in FLA's
// and Megatron's CP) and backward always follows a forward of the same call.
struct LayerKernel {
  std::function<void(const Problem&, const Inputs&, const Outputs&)> forward;
  std::function<void(const Problem&, const Inputs&, const Cotangents&, const Grads&)> backward;
};

template <class S>
struct LayerInputs {
  Tensor<S> x;                      // [B,T,hidden]
  std::vector<int64_t> cu_seqlens;  // [N+1] or empty (dense: N = B)
  Tensor<S> initial_state;          // optional [N,HV,K,V]
  Tensor<S> x_halo;                 // optional [P,hidden], P <= W-1: tokens before the first (CP)
  LayerKernel kernel;               // optional: how the kernel runs (CP)
};

// What each stage produced, bshd (token axis 1), cut back to the unpadded T.
template <class S>
struct LayerStages {
  Tensor<S> qkv_proj;     // [B,T,Dc]  projection before the conv, Dc = 2*H*K + HV*V
  Tensor<S> g;            // [B,T,HV,K] (kda) or [B,T,HV] (gdn): raw gate into the kernel
  Tensor<S> gate;         // [B,T,HV,V] output gate before its activation
  Tensor<S> beta_logit;   // [B,T,HV]
  Tensor<S> qkv_conv;     // [B,T,Dc]  after conv + SiLU
  Tensor<S> q, k;         // [B,T,H,K] kernel inputs (after the L2 norm)
  Tensor<S> v;            // [B,T,HV,V]
  Tensor<S> beta;         // [B,T,HV]
  Tensor<S> a;            // shaped like g: the log decay gate(g + dt_bias) the kernel applies (for diagnosis:
                          // the kernel computes its own from g, so a hook changing `a` changes nothing)
  Tensor<S> o;            // [B,T,HV,V] kernel output
  Tensor<S> final_state;  // [N,HV,K,V] (after the pad tokens when padded)
  Tensor<S> norm_out;     // [B,T,HV,V] rmsnorm(o) w, before the gate
  Tensor<S> y;            // [B,T,HV,V] gated
  Tensor<S> out;          // [B,T,hidden]
};

template <class S>
struct LayerGrads {
  Tensor<S> dx;               // [B,T,hidden]
  LayerParams<S> dparams;     // same names and shapes as the params
  Tensor<S> d_initial_state;  // when an initial state was given
  Tensor<S> dx_halo;          // when a halo was given
  LayerStages<S> dstages;     // gradients w.r.t. each stage's output (o, q, k, v, g, beta, ...)
};

// The flags the layer passes to the kernel: raw g with the in-kernel gate, beta already a probability,
// q and k already normalised (use_qk_l2norm_in_kernel = false, as Megatron and MaxText call it).
Flags layer_kernel_flags(const LayerConfig& c);

// Called after each stage with its name (a LayerStages field: "qkv_proj", "g", "gate", "beta_logit",
// "qkv_conv", "q", "k", "v", "beta", "a", "o", "norm_out", "y", "out") and its tensor, which it may change:
// later stages read the changed tensor. Tests plant errors with it.
template <class S> using LayerHook = std::function<void(const std::string& stage, Tensor<S>& t)>;

template <class S>
LayerStages<S> layer_forward(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in,
                             const LayerHook<S>& hook = {});
// Gradients of L = sum(out * dout) + sum(final_state * dht) (dht optional, [N,HV,K,V]).
template <class S>
LayerGrads<S> layer_backward(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in,
                             const Tensor<S>& dout, const Tensor<S>& dht);

}  // namespace kcp::ref
