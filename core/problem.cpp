// make_problem(): size inference and argument validation for every backend (see problem.h).
#include "core/problem.h"

#include <cmath>
#include <sstream>
#include <vector>

namespace kcp {

std::string_view variant_name(Variant v) {
  switch (v) {
    case Variant::gdn: return "gdn";
    case Variant::kda: return "kda";
    case Variant::gla: return "gla";
  }
  return "?";
}

Variant variant_parse(std::string_view s) {
  if (s == "gdn") return Variant::gdn;
  if (s == "kda") return Variant::kda;
  if (s == "gla") return Variant::gla;
  throw Error(detail::concat("unknown op '", s, "' (expected gdn, kda or gla)"));
}

GateFormula Problem::gate_formula() const {
  if (!flags.use_gate_in_kernel) return GateFormula::log_decay;
  return flags.lower_bound ? GateFormula::lower_bound : GateFormula::softplus;
}

SeqRange Problem::sequence(int64_t n) const {
  if (varlen()) return {0, cu_seqlens[size_t(n)], cu_seqlens[size_t(n) + 1] - cu_seqlens[size_t(n)]};
  return {n, 0, T};
}

std::string Problem::describe() const {
  std::ostringstream os;
  os << variant_name(variant) << "(B=" << B << ",T=" << T << ",H=" << H << ",HV=" << HV
     << ",K=" << K << ",V=" << V << ",N=" << N << ",C=" << chunk_size;
  if (varlen()) os << ",varlen";
  if (flags.use_qk_l2norm_in_kernel) os << ",l2norm";
  if (flags.use_beta_sigmoid_in_kernel) os << ",beta_sigmoid";
  if (flags.allow_neg_eigval) os << ",neg_eigval";
  if (flags.use_gate_in_kernel) os << ",gate=" << (flags.lower_bound ? "lower_bound" : "softplus");
  if (flags.state_v_first) os << ",state_v_first";
  os << ",scale=" << scale << "," << dtype_name(compute) << ")";
  return os.str();
}

Shape shape_qk(const Problem& p) { return {p.B, p.T, p.H, p.K}; }
Shape shape_v(const Problem& p) { return {p.B, p.T, p.HV, p.V}; }
Shape shape_g(const Problem& p) {
  return p.per_channel_gate() ? Shape{p.B, p.T, p.HV, p.K} : Shape{p.B, p.T, p.HV};
}
Shape shape_beta(const Problem& p) { return {p.B, p.T, p.HV}; }
Shape shape_state(const Problem& p) {
  return p.flags.state_v_first ? Shape{p.N, p.HV, p.V, p.K} : Shape{p.N, p.HV, p.K, p.V};
}
Shape shape_dt_bias(const Problem& p) {
  return p.per_channel_gate() ? Shape{p.HV * p.K} : Shape{p.HV};
}

namespace {

void expect_shape(const char* name, const TensorView& t, const Shape& want, const char* dims) {
  KCP_CHECK(t.shape == want, name, ": expected shape ", dims, " = ", shape_str(want), ", got ",
            shape_str(t.shape));
}

void expect_float(const char* name, const TensorView& t) {
  KCP_CHECK(dtype_is_float(t.dtype), name, ": expected a floating-point tensor, got ",
            dtype_name(t.dtype));
}

// First non-finite element of a host view, reported with its multi-index. Walks the view row by
// row along its last axis (no copy of the tensor: this runs on every backward call).
void expect_finite(const char* name, const TensorView& t) {
  if (t.empty() || t.device != Device::host || shape_numel(t.shape) == 0) return;
  const int r = t.rank();
  const int64_t inner = r ? t.shape[size_t(r - 1)] : 1, step = r ? t.stride[size_t(r - 1)] : 1;
  std::vector<double> row(static_cast<size_t>(inner));
  for (int64_t ri = 0, rows = shape_numel(t.shape) / inner; ri < rows; ++ri) {
    int64_t off = 0;
    for (int64_t rem = ri, d = r - 2; d >= 0; --d) {
      off += (rem % t.shape[size_t(d)]) * t.stride[size_t(d)];
      rem /= t.shape[size_t(d)];
    }
    view_load<double>(t, off, inner, step, row.data());
    for (int64_t j = 0; j < inner; ++j) {
      if (std::isfinite(row[size_t(j)])) continue;
      Shape idx(t.shape.size());
      for (int64_t rem = ri * inner + j, d = int64_t(idx.size()) - 1; d >= 0; --d) {
        idx[size_t(d)] = rem % t.shape[size_t(d)];
        rem /= t.shape[size_t(d)];
      }
      throw Error(detail::concat(name, ": non-finite value ", row[size_t(j)], " at index ", shape_str(idx),
                                 " (inputs must be finite)"));
    }
  }
}

void check_cu_seqlens(const std::vector<int64_t>& cu, int64_t B, int64_t T) {
  KCP_CHECK(B == 1, "cu_seqlens: packed sequences need B = 1, got B = ", B);
  KCP_CHECK(cu.size() >= 2, "cu_seqlens: expected at least 2 entries [0, ..., T], got ", cu.size());
  KCP_CHECK(cu.front() == 0, "cu_seqlens: must start at 0, got ", cu.front());
  for (size_t i = 1; i < cu.size(); ++i)
    KCP_CHECK(cu[i] >= cu[i - 1], "cu_seqlens: must be nondecreasing, but entry ", i, " = ", cu[i],
              " < entry ", i - 1, " = ", cu[i - 1]);
  KCP_CHECK(cu.back() == T, "cu_seqlens: must end at T = ", T, ", got ", cu.back());
}

void check_gate_args(const Problem& p, const Inputs& in) {
  const Flags& f = p.flags;
  if (f.lower_bound) {
    KCP_CHECK(p.per_channel_gate(), "lower_bound: applies to per-channel gates (kda, gla), not ",
              variant_name(p.variant));
    KCP_CHECK(std::isfinite(*f.lower_bound) && *f.lower_bound < 0,
              "lower_bound: must be negative and finite, got ", *f.lower_bound);
  }
  if (f.safe_gate)
    KCP_CHECK(f.lower_bound && *f.lower_bound >= -5 && *f.lower_bound < 0,
              "safe_gate: requires -5 <= lower_bound < 0");
  if (!f.use_gate_in_kernel) {
    KCP_CHECK(in.A_log.empty(), "A_log: given without use_gate_in_kernel (it would be ignored)");
    KCP_CHECK(in.dt_bias.empty(), "dt_bias: given without use_gate_in_kernel (it would be ignored)");
    return;
  }
  if (p.gate_formula() == GateFormula::softplus)
    KCP_CHECK(!in.A_log.empty(), "A_log: required by use_gate_in_kernel with the softplus gate "
              "-exp(A_log) * softplus(g + dt_bias)");
  if (!in.A_log.empty()) expect_shape("A_log", in.A_log, {p.HV}, "[HV]");
  if (!in.dt_bias.empty())
    expect_shape("dt_bias", in.dt_bias, shape_dt_bias(p), p.per_channel_gate() ? "[HV*K]" : "[HV]");
}

void check_flags(const Problem& p) {
  const Flags& f = p.flags;
  KCP_CHECK(!f.allow_neg_eigval || f.use_beta_sigmoid_in_kernel,
            "allow_neg_eigval: requires use_beta_sigmoid_in_kernel (as in FLA)");
  if (!p.delta_rule())
    KCP_CHECK(!f.use_beta_sigmoid_in_kernel && !f.allow_neg_eigval,
              "gla has no beta: use_beta_sigmoid_in_kernel and allow_neg_eigval must be off");
  KCP_CHECK(std::isfinite(p.scale) && p.scale > 0, "scale: must be positive and finite, got ", p.scale);
  KCP_CHECK(p.chunk_size >= 1, "chunk_size: must be positive, got ", p.chunk_size);
  KCP_CHECK(p.compute == DType::f64 || p.compute == DType::f32,
            "compute: must be float64 or float32, got ", dtype_name(p.compute));
}

}  // namespace

Problem make_problem(Variant variant, const Inputs& in, const Flags& flags, const ProblemOptions& opt) {
  KCP_CHECK(!in.q.empty() && !in.k.empty() && !in.v.empty() && !in.g.empty(),
            "q, k, v and g are required");
  KCP_CHECK(in.q.rank() == 4, "q: expected shape [B,T,H,K], got ", shape_str(in.q.shape));
  KCP_CHECK(in.v.rank() == 4, "v: expected shape [B,T,HV,V], got ", shape_str(in.v.shape));
  Problem p;
  p.variant = variant;
  p.flags = flags;
  p.B = in.q.dim(0), p.T = in.q.dim(1), p.H = in.q.dim(2), p.K = in.q.dim(3);
  p.HV = in.v.dim(2), p.V = in.v.dim(3);
  p.chunk_size = opt.chunk_size;
  p.compute = opt.compute;
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(p.K));
  p.cu_seqlens = opt.cu_seqlens;
  KCP_CHECK(p.H >= 1 && p.K >= 1 && p.HV >= 1 && p.V >= 1 && p.B >= 1 && p.T >= 0,
            "q, v: sizes must be positive, got q ", shape_str(in.q.shape), ", v ", shape_str(in.v.shape));
  KCP_CHECK(in.v.dim(0) == p.B && in.v.dim(1) == p.T, "v: expected [B,T,HV,V] with B = ", p.B,
            ", T = ", p.T, " (from q), got ", shape_str(in.v.shape));
  KCP_CHECK(p.HV % p.H == 0, "v: HV = ", p.HV, " value heads must be a multiple of H = ", p.H,
            " q/k heads");
  if (p.varlen()) check_cu_seqlens(p.cu_seqlens, p.B, p.T);
  p.N = p.varlen() ? int64_t(p.cu_seqlens.size()) - 1 : p.B;
  check_flags(p);

  expect_shape("k", in.k, shape_qk(p), "[B,T,H,K]");
  expect_shape("g", in.g, shape_g(p), p.per_channel_gate() ? "[B,T,HV,K]" : "[B,T,HV]");
  if (p.delta_rule()) {
    KCP_CHECK(!in.beta.empty(), "beta: required by ", variant_name(variant));
    expect_shape("beta", in.beta, shape_beta(p), "[B,T,HV]");
  } else {
    KCP_CHECK(in.beta.empty(), "beta: gla has no beta, but one was given");
  }
  if (!in.initial_state.empty())
    expect_shape("initial_state", in.initial_state, shape_state(p),
                 flags.state_v_first ? "[N,HV,V,K]" : "[N,HV,K,V]");
  check_gate_args(p, in);

  const std::pair<const char*, const TensorView*> all[] = {
      {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"g", &in.g}, {"beta", &in.beta},
      {"A_log", &in.A_log}, {"dt_bias", &in.dt_bias}, {"initial_state", &in.initial_state}};
  for (auto [name, t] : all) {
    if (t->empty()) continue;
    expect_float(name, *t);
    KCP_CHECK(t->device == in.q.device, name, ": lives on a different device than q");
    if (opt.check_finite) expect_finite(name, *t);
  }
  return p;
}

void check_outputs(const Problem& p, const Outputs& out) {
  KCP_CHECK(!out.o.empty(), "o: output view is required");
  expect_shape("o", out.o, shape_v(p), "[B,T,HV,V]");
  if (!out.final_state.empty())
    expect_shape("final_state", out.final_state, shape_state(p), "[N,HV,K,V]");
}

void check_cotangents(const Problem& p, const Cotangents& d) {
  KCP_CHECK(!d.d_o.empty(), "do: the output cotangent is required");
  expect_shape("do", d.d_o, shape_v(p), "[B,T,HV,V]");
  if (!d.d_final_state.empty())
    expect_shape("dht", d.d_final_state, shape_state(p), "[N,HV,K,V]");
  if (d.d_o.device == Device::host) {
    expect_finite("do", d.d_o);
    expect_finite("dht", d.d_final_state);
  }
}

void check_grads(const Problem& p, const Inputs& in, const Grads& gr) {
  auto opt = [](const char* name, const TensorView& t, const Shape& s, const char* dims) {
    if (!t.empty()) expect_shape(name, t, s, dims);
  };
  opt("dq", gr.dq, shape_qk(p), "[B,T,H,K]");
  opt("dk", gr.dk, shape_qk(p), "[B,T,H,K]");
  opt("dv", gr.dv, shape_v(p), "[B,T,HV,V]");
  opt("dg", gr.dg, shape_g(p), "shape of g");
  opt("dbeta", gr.dbeta, shape_beta(p), "[B,T,HV]");
  opt("d_initial_state", gr.d_initial_state, shape_state(p), "shape of initial_state");
  opt("dA_log", gr.dA_log, {p.HV}, "[HV]");
  opt("ddt_bias", gr.ddt_bias, shape_dt_bias(p), "shape of dt_bias");
  KCP_CHECK(gr.dbeta.empty() || p.delta_rule(), "dbeta: gla has no beta");
  KCP_CHECK(gr.dA_log.empty() || !in.A_log.empty(), "dA_log: requested, but A_log was not given");
  KCP_CHECK(gr.ddt_bias.empty() || !in.dt_bias.empty(), "ddt_bias: requested, but dt_bias was not given");
  KCP_CHECK(gr.d_initial_state.empty() || !in.initial_state.empty(),
            "d_initial_state: requested, but initial_state was not given");
}

}  // namespace kcp
