// One call of a gated delta-rule / gated linear attention operator: variant, sizes, flags, and
// the tensors as FLA receives them. make_problem() derives the sizes from the tensors and rejects
// every inconsistent or out-of-range argument with a message naming it.
//
//   q, k  [B,T,H,K]      v [B,T,HV,V]      g [B,T,HV] (gdn) or [B,T,HV,K] (kda, gla)
//   beta  [B,T,HV]       (absent for gla)  A_log [HV]   dt_bias [HV] (gdn) or [HV*K] (kda, gla)
//   initial_state / final_state [N,HV,K,V] ([N,HV,V,K] with state_v_first)
//   cu_seqlens [N+1] (host, B must be 1); without it N = B and each batch row is one sequence.
// Covered by tests/core/test_problem.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kcp {

enum class Variant { gdn, kda, gla };
std::string_view variant_name(Variant v);
Variant variant_parse(std::string_view name);

// FLA's keyword flags, with FLA's meaning (docs: ALGORITHMS.md section 2).
struct Flags {
  bool use_qk_l2norm_in_kernel = false;    // q,k <- x / sqrt(sum x^2 + 1e-6)
  bool use_beta_sigmoid_in_kernel = false; // beta <- s * sigmoid(beta), s = 2 with allow_neg_eigval
  bool allow_neg_eigval = false;           // requires the beta sigmoid (as in FLA)
  bool use_gate_in_kernel = false;         // g is a raw gate; see GateFormula
  std::optional<double> lower_bound;       // kda/gla: selects lb * sigmoid(exp(A_log)(g + dt_bias))
  bool safe_gate = false;                  // FLA kernel detail; requires -5 <= lower_bound < 0
  bool state_v_first = false;              // states stored [.., V, K] instead of [.., K, V]
};

enum class GateFormula {
  log_decay,    // g is the natural-log decay itself
  softplus,     // a = -exp(A_log) * softplus(g + dt_bias)
  lower_bound,  // a = lower_bound * sigmoid(c * (g + dt_bias)), c = exp(A_log) or 1
};

struct Inputs {
  TensorView q, k, v, g, beta;  // beta empty for gla
  TensorView A_log, dt_bias;    // only with use_gate_in_kernel (A_log optional in the lb form)
  TensorView initial_state;     // optional
};
struct Outputs {
  TensorView o;            // [B,T,HV,V]
  TensorView final_state;  // optional: [N,HV,K,V]
};
struct Cotangents {
  TensorView d_o;            // [B,T,HV,V]
  TensorView d_final_state;  // optional: [N,HV,K,V]; absent means zero
};
struct Grads {  // each optional: an empty view is not computed
  TensorView dq, dk, dv, dg, dbeta, d_initial_state, dA_log, ddt_bias;
};

struct SeqRange {
  int64_t b, t0, len;  // batch row, first token, token count
};

struct Problem {
  Variant variant = Variant::gdn;
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, N = 0;
  int64_t chunk_size = 64;       // C: used by the chunkwise algorithms only
  double scale = 0;              // o_t = S_t^T (scale q_t); defaults to K^-0.5
  Flags flags;
  std::vector<int64_t> cu_seqlens;  // host copy; empty = dense batch
  DType compute = DType::f64;    // precision the backend is asked to compute in

  int64_t G() const { return HV / H; }  // value heads per q/k head (GVA)
  bool varlen() const { return !cu_seqlens.empty(); }
  bool delta_rule() const { return variant != Variant::gla; }
  bool per_channel_gate() const { return variant != Variant::gdn; }
  GateFormula gate_formula() const;
  SeqRange sequence(int64_t n) const;
  std::string describe() const;  // "kda(B=1,T=100,H=2,HV=2,K=32,V=32,N=1,...)"
};

struct ProblemOptions {
  std::optional<double> scale;
  int64_t chunk_size = 64;
  DType compute = DType::f64;
  std::vector<int64_t> cu_seqlens;  // empty = dense
  bool check_finite = true;         // scan host inputs for NaN/Inf
};

// Derives sizes from the tensors, fills defaults and validates everything a user can get wrong.
Problem make_problem(Variant variant, const Inputs& in, const Flags& flags, const ProblemOptions& opt = {});

// Checks that output / gradient / cotangent views have the shapes `p` implies (empty views pass).
void check_outputs(const Problem& p, const Outputs& out);
void check_cotangents(const Problem& p, const Cotangents& d);
void check_grads(const Problem& p, const Inputs& in, const Grads& gr);

// Expected shapes, written once here.
Shape shape_qk(const Problem& p);     // [B,T,H,K]
Shape shape_v(const Problem& p);      // [B,T,HV,V]
Shape shape_g(const Problem& p);      // [B,T,HV] or [B,T,HV,K]
Shape shape_beta(const Problem& p);   // [B,T,HV]
Shape shape_state(const Problem& p);  // [N,HV,K,V] or [N,HV,V,K]
Shape shape_dt_bias(const Problem& p);  // [HV] or [HV*K]

}  // namespace kcp
