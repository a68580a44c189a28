// The layer forward and backward (formulas in layer.h): projections (layer_proj.cpp), conv1d + SiLU
// (conv1d.cpp), L2 norm, beta sigmoid, the kernel on a CPU backend, the gated RMSNorm and the output
// projection (layer_ops.cpp). The backward recomputes the forward (an oracle keeps nothing between
// calls) and runs the same stages in reverse. Padding (pad_multiple) wraps both.
#include "reference/layer.h"

#include <cmath>

#include "core/error.h"
#include "reference/conv1d.h"
#include "reference/gates.h"
#include "reference/layer_proj.h"

namespace kcp::ref {

Flags layer_kernel_flags(const LayerConfig& c) {
  Flags f;
  f.use_gate_in_kernel = true;
  f.lower_bound = c.lower_bound;
  f.safe_gate = c.safe_gate;
  return f;
}

namespace {

// One pass over (possibly padded) tokens: the stages plus what the backward needs.
template <class S>
struct Pass {
  LayerStages<S> st;
  Mat<S> x, x_halo;        // token rows
  Mat<S> q_rstd, k_rstd;   // [rows, H] (with the L2 norm)
  Tensor<S> conv_halo;     // [P, Dc] projection of x_halo
  Problem kp;              // the kernel call
  Inputs kin;              // views into st
};

template <class S> constexpr DType compute_of() { return dtype_of<S>(); }

template <class S>
Tensor<S> columns(const Mat<S>& m, int64_t c0, int64_t n, const Shape& shape) {
  return rows_tensor<S>(m.middleCols(c0, n), shape);
}

template <class S>
void run_kernel_forward(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in, Pass<S>& ps) {
  LayerStages<S>& st = ps.st;
  ps.kin = Inputs{st.q.view(), st.k.view(), st.v.view(), st.g.view(), st.beta.view(),
                  param(w, "A_log").view(), param(w, "dt_bias").view(), in.initial_state.view()};
  ProblemOptions opt;
  opt.scale = c.scale;
  opt.chunk_size = c.chunk_size;
  opt.compute = compute_of<S>();
  opt.cu_seqlens = in.cu_seqlens;
  ps.kp = make_problem(c.variant, ps.kin, layer_kernel_flags(c), opt);
  st.o = Tensor<S>(shape_v(ps.kp));
  st.final_state = Tensor<S>(shape_state(ps.kp));
  if (in.kernel.forward) return in.kernel.forward(ps.kp, ps.kin, Outputs{st.o.view(), {}});
  const auto backend = make_cpu_backend(c.kernel);
  require_support(*backend, ps.kp);
  backend->forward(ps.kp, ps.kin, Outputs{st.o.view(), st.final_state.view()});
}

// The in-kernel gate applied to g (gates.h), as the kernel applies it: a stage of its own in dumps.
template <class S>
Tensor<S> log_decay(const LayerConfig& c, const LayerParams<S>& w, const Tensor<S>& g) {
  const Tensor<S>& A = param(w, "A_log");
  const Tensor<S>& dt = param(w, "dt_bias");
  const int64_t width = c.g_dim(), per_head = width / c.HV;
  Tensor<S> a(g.shape());
  GateParams<S> gp;
  gp.formula = c.lower_bound ? GateFormula::lower_bound : GateFormula::softplus;
  gp.has_A_log = true, gp.lower_bound = S(c.lower_bound.value_or(0));
  for (int64_t i = 0; i < g.numel(); ++i) {
    const int64_t col = i % width;
    gp.A_log = A.data()[col / per_head];
    a.data()[i] = gate_forward(gp, g.data()[i] + dt.data()[col]);
  }
  return a;
}

template <class S>
Pass<S> forward_pass(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in, const LayerHook<S>& hook) {
  KCP_CHECK(in.x.shape().size() == 3 && in.x.dim(2) == c.hidden, "layer: x must be [B,T,hidden=", c.hidden,
            "], got ", shape_str(in.x.shape()));
  const int64_t B = in.x.dim(0), T = in.x.dim(1), Dc = c.conv_dim(), qk = c.qk_dim();
  Pass<S> ps;
  LayerStages<S>& st = ps.st;
  const auto done = [&](const char* name, Tensor<S>& t) {
    if (hook) hook(name, t);
  };
  ps.x = tensor_rows(in.x, c.hidden);
  const Projected<S> p = project(c, w, ps.x, false);
  done("qkv_proj", st.qkv_proj = rows_tensor<S>(p.qkv, {B, T, Dc}));
  done("g", st.g = rows_tensor<S>(p.g, c.variant == Variant::gdn ? Shape{B, T, c.HV} : Shape{B, T, c.HV, c.K}));
  done("gate", st.gate = rows_tensor<S>(p.gate, {B, T, c.HV, c.V}));
  done("beta_logit", st.beta_logit = rows_tensor<S>(p.b, {B, T, c.HV}));
  if (!in.x_halo.empty()) {
    ps.x_halo = tensor_rows(in.x_halo, c.hidden);
    ps.conv_halo = rows_tensor<S>(project(c, w, ps.x_halo, true).qkv, {ps.x_halo.rows(), Dc});
  }
  st.qkv_conv = Tensor<S>({B, T, Dc});
  const Tensor<S>& cw = param(w, "conv1d.weight");
  const TensorView cb = c.conv_bias ? param(w, "conv1d.bias").view() : TensorView{};
  const Conv1dProblem cp = make_conv1d_problem(st.qkv_proj.view(), cw.view(), cb, in.cu_seqlens, true,
                                               ps.conv_halo.view(), compute_of<S>());
  conv1d_forward(cp, st.qkv_proj.view(), cw.view(), cb, ps.conv_halo.view(), st.qkv_conv.view());
  done("qkv_conv", st.qkv_conv);
  const Mat<S> conv = tensor_rows(st.qkv_conv, Dc);
  Mat<S> q = conv.leftCols(qk), k = conv.middleCols(qk, qk);
  if (c.qk_l2norm) {
    q = l2norm_forward<S>(q, c.K, S(c.l2norm_eps), &ps.q_rstd);
    k = l2norm_forward<S>(k, c.K, S(c.l2norm_eps), &ps.k_rstd);
  }
  done("q", st.q = rows_tensor<S>(q, {B, T, c.H, c.K}));
  done("k", st.k = rows_tensor<S>(k, {B, T, c.H, c.K}));
  done("v", st.v = columns<S>(conv, 2 * qk, c.v_dim(), {B, T, c.HV, c.V}));
  done("beta", st.beta = rows_tensor<S>(sigmoid_forward<S>(tensor_rows(st.beta_logit, c.HV)), {B, T, c.HV}));
  done("a", st.a = log_decay(c, w, st.g));
  run_kernel_forward(c, w, in, ps);
  done("o", st.o);
  const Vec<S> nw = Eigen::Map<const Vec<S>>(param(w, "out_norm.weight").data(), c.V);
  const RmsGated<S> rg = rms_gated_forward<S>(tensor_rows(st.o, c.v_dim()), nw, tensor_rows(st.gate, c.v_dim()), c.V,
                                              S(c.norm_eps), c.output_gate);
  done("norm_out", st.norm_out = rows_tensor<S>(rg.n, {B, T, c.HV, c.V}));
  done("y", st.y = rows_tensor<S>(rg.y, {B, T, c.HV, c.V}));
  const Tensor<S>& wo = param(w, "out_proj.weight");
  done("out", st.out = rows_tensor<S>(linear_forward<S>(tensor_rows(st.y, c.v_dim()), tensor_rows(wo, wo.dim(1))),
                                      {B, T, c.hidden}));
  return ps;
}

template <class S>
LayerParams<S> zero_like(const LayerParams<S>& w) {
  LayerParams<S> z;
  for (const auto& [name, t] : w) z[name] = Tensor<S>(t.shape());
  return z;
}

// Kernel backward: fills dq, dk, dv, dg, dbeta (kernel inputs), d_initial_state, dA_log, ddt_bias.
template <class S>
void run_kernel_backward(const LayerConfig& c, const LayerInputs<S>& in, const Pass<S>& ps, const Tensor<S>& d_o,
                         const Tensor<S>& dht, LayerGrads<S>& gr) {
  LayerStages<S>& ds = gr.dstages;
  const LayerStages<S>& st = ps.st;
  ds.q = Tensor<S>(st.q.shape()), ds.k = Tensor<S>(st.k.shape()), ds.v = Tensor<S>(st.v.shape());
  ds.g = Tensor<S>(st.g.shape()), ds.beta = Tensor<S>(st.beta.shape());
  if (!in.initial_state.empty()) gr.d_initial_state = Tensor<S>(in.initial_state.shape());
  const Grads g{ds.q.view(), ds.k.view(), ds.v.view(), ds.g.view(), ds.beta.view(), gr.d_initial_state.view(),
                gr.dparams["A_log"].view(), gr.dparams["dt_bias"].view()};
  if (in.kernel.backward) return in.kernel.backward(ps.kp, ps.kin, Cotangents{d_o.view(), dht.view()}, g);
  const auto backend = make_cpu_backend(c.kernel);
  backend->backward(ps.kp, ps.kin, Cotangents{d_o.view(), dht.view()}, g);
}

template <class S>
LayerGrads<S> backward_pass(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in,
                            const Pass<S>& ps, const Tensor<S>& dout, const Tensor<S>& dht) {
  const LayerStages<S>& st = ps.st;
  const int64_t B = in.x.dim(0), T = in.x.dim(1), Dc = c.conv_dim(), qk = c.qk_dim();
  LayerGrads<S> gr;
  LayerStages<S>& ds = gr.dstages;
  gr.dparams = zero_like(w);
  KCP_CHECK(dout.shape() == st.out.shape(), "layer: dout must be ", shape_str(st.out.shape()), ", got ",
            shape_str(dout.shape()));
  ds.out = dout;
  const Mat<S> dout_r = tensor_rows(dout, c.hidden), y = tensor_rows(st.y, c.v_dim());
  const Tensor<S>& wo = param(w, "out_proj.weight");
  Mat<S> dy = Mat<S>::Zero(y.rows(), y.cols()), dwo = Mat<S>::Zero(wo.dim(0), wo.dim(1));
  linear_backward<S>(y, tensor_rows(wo, wo.dim(1)), dout_r, &dy, &dwo);
  add_rows(gr.dparams["out_proj.weight"], dwo);
  ds.y = rows_tensor<S>(dy, st.y.shape());
  Mat<S> d_o, dgate;
  Vec<S> dnw = Vec<S>::Zero(c.V);
  const Vec<S> nw = Eigen::Map<const Vec<S>>(param(w, "out_norm.weight").data(), c.V);
  rms_gated_backward<S>(tensor_rows(st.o, c.v_dim()), nw,
                        tensor_rows(st.gate, c.v_dim()), c.V, S(c.norm_eps), c.output_gate, dy, &d_o, &dgate, &dnw);
  add_rows(gr.dparams["out_norm.weight"], Mat<S>(dnw));
  ds.o = rows_tensor<S>(d_o, st.o.shape());
  ds.gate = rows_tensor<S>(dgate, st.gate.shape());
  run_kernel_backward(c, in, ps, ds.o, dht, gr);
  Projected<S> dp;
  dp.g = tensor_rows(ds.g, c.g_dim()), dp.gate = dgate;
  dp.b = sigmoid_backward<S>(tensor_rows(st.beta, c.HV), tensor_rows(ds.beta, c.HV));
  ds.beta_logit = rows_tensor<S>(dp.b, st.beta_logit.shape());
  Mat<S> dq = tensor_rows(ds.q, qk), dk = tensor_rows(ds.k, qk);
  if (c.qk_l2norm) {
    dq = l2norm_backward<S>(tensor_rows(st.q, qk), ps.q_rstd, dq, c.K);
    dk = l2norm_backward<S>(tensor_rows(st.k, qk), ps.k_rstd, dk, c.K);
  }
  Mat<S> dconv(dq.rows(), Dc);
  dconv << dq, dk, tensor_rows(ds.v, c.v_dim());
  ds.qkv_conv = rows_tensor<S>(dconv, {B, T, Dc});
  ds.qkv_proj = Tensor<S>({B, T, Dc});
  const Tensor<S>& cw = param(w, "conv1d.weight");
  const TensorView cb = c.conv_bias ? param(w, "conv1d.bias").view() : TensorView{};
  Tensor<S> dhalo;  // [P, Dc] when a halo was given
  if (!ps.conv_halo.empty()) dhalo = Tensor<S>(ps.conv_halo.shape());
  const Conv1dProblem cp = make_conv1d_problem(st.qkv_proj.view(), cw.view(), cb, in.cu_seqlens, true,
                                               ps.conv_halo.view(), compute_of<S>());
  conv1d_backward(cp, st.qkv_proj.view(), cw.view(), cb, ps.conv_halo.view(), ds.qkv_conv.view(),
                  ds.qkv_proj.view(), gr.dparams["conv1d.weight"].view(),
                  c.conv_bias ? gr.dparams["conv1d.bias"].view() : TensorView{}, dhalo.view());
  dp.qkv = tensor_rows(ds.qkv_proj, Dc);
  Mat<S> dx = Mat<S>::Zero(ps.x.rows(), c.hidden);
  project_backward(c, w, ps.x, dp, &dx, &gr.dparams);
  gr.dx = rows_tensor<S>(dx, in.x.shape());
  if (!ps.conv_halo.empty()) {
    Projected<S> dph;
    dph.qkv = tensor_rows(dhalo, Dc);
    Mat<S> dxh = Mat<S>::Zero(ps.x_halo.rows(), c.hidden);
    project_backward(c, w, ps.x_halo, dph, &dxh, &gr.dparams);
    gr.dx_halo = rows_tensor<S>(dxh, in.x_halo.shape());
  }
  return gr;
}

// Token axis 1 of a bshd tensor cut to `T` rows, or zero-padded to it.
template <class S>
Tensor<S> resize_tokens(const Tensor<S>& t, int64_t T) {
  if (t.empty()) return t;
  Shape s = t.shape();
  const int64_t B = s[0], T0 = s[1], row = t.numel() / std::max<int64_t>(1, B * T0);
  s[1] = T;
  Tensor<S> r(s);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < std::min(T, T0) * row; ++i) r.data()[b * T * row + i] = t.data()[b * T0 * row + i];
  return r;
}

template <class S>
void resize_stages(LayerStages<S>& s, int64_t T) {
  for (Tensor<S>* t : {&s.qkv_proj, &s.g, &s.gate, &s.beta_logit, &s.qkv_conv, &s.q, &s.k, &s.v, &s.beta, &s.a, &s.o,
                       &s.norm_out, &s.y, &s.out})
    *t = resize_tokens(*t, T);
}

// The padded call, or the call itself when no padding applies.
template <class S>
int64_t padded_T(const LayerConfig& c, const LayerInputs<S>& in) {
  const int64_t T = in.x.dim(1), m = c.pad_multiple;
  if (m == 0 || T % m == 0) return T;
  KCP_CHECK(in.cu_seqlens.empty(), "layer: padding to a multiple of ", m, " is for dense batches (MaxText "
            "rejects packed sequences); set pad_multiple = 0 with cu_seqlens");
  return (T + m - 1) / m * m;
}

}  // namespace

template <class S>
LayerStages<S> layer_forward(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in,
                             const LayerHook<S>& hook) {
  check_layer_config(c);
  const int64_t T = in.x.dim(1), Tp = padded_T(c, in);
  if (Tp == T) return forward_pass(c, w, in, hook).st;
  LayerInputs<S> pin = in;
  pin.x = resize_tokens(in.x, Tp);
  LayerStages<S> st = forward_pass(c, w, pin, hook).st;
  resize_stages(st, T);
  return st;
}

template <class S>
LayerGrads<S> layer_backward(const LayerConfig& c, const LayerParams<S>& w, const LayerInputs<S>& in,
                             const Tensor<S>& dout, const Tensor<S>& dht) {
  check_layer_config(c);
  const int64_t T = in.x.dim(1), Tp = padded_T(c, in);
  LayerInputs<S> pin = in;
  if (Tp != T) pin.x = resize_tokens(in.x, Tp);
  const Pass<S> ps = forward_pass(c, w, pin, {});
  LayerGrads<S> gr = backward_pass(c, w, pin, ps, Tp == T ? dout : resize_tokens(dout, Tp), dht);
  if (Tp != T) {
    gr.dx = resize_tokens(gr.dx, T);
    resize_stages(gr.dstages, T);
  }
  return gr;
}

template LayerStages<double> layer_forward(const LayerConfig&, const LayerParams<double>&, const LayerInputs<double>&,
                                           const LayerHook<double>&);
template LayerStages<float> layer_forward(const LayerConfig&, const LayerParams<float>&, const LayerInputs<float>&,
                                          const LayerHook<float>&);
template LayerGrads<double> layer_backward(const LayerConfig&, const LayerParams<double>&, const LayerInputs<double>&,
                                           const Tensor<double>&, const Tensor<double>&);
template LayerGrads<float> layer_backward(const LayerConfig&, const LayerParams<float>&, const LayerInputs<float>&,
                                          const Tensor<float>&, const Tensor<float>&);

}  // namespace kcp::ref
