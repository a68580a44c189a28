// Seeded test problems: a CaseSpec names a problem (its name() is the doctest subcase name and the
// filter key), make_case() draws its inputs and cotangents from a counter-based RNG (core/rng.h),
// so a case is reproduced from its printed name and seed alone.
// Distributions (as FLA's tests draw them): q, k ~ N(0,1) then L2-normalized (raw when the kernel
// normalizes), v ~ N(0,1), log decay g ~ U(-0.3, -0.001) (raw gate ~ N(0,1) with
// A_log = log U(1,16), dt_bias ~ N(0, 0.5^2) when the gate is fused), beta ~ U(0,1) (logits ~ N(0,1)
// with the fused sigmoid), h0, do, dht ~ N(0,1).
// Covered by the suites that draw from it (tests/reference, tests/chunkwise, tests/cp, the cp-sweep).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"

namespace kcp::val {

struct CaseSpec {
  Variant variant = Variant::gdn;
  int64_t B = 1, T = 64, H = 2, HV = 2, K = 16, V = 16;
  std::vector<int64_t> seqlens;  // non-empty: packed sequences (B = 1, T = their sum)
  Flags flags;
  bool initial_state = true;     // give h0 (and ask for dh0)
  bool final_state = true;       // ask for the final state (and give dht)
  bool A_log = true, dt_bias = true;  // with use_gate_in_kernel
  int64_t chunk_size = 64;
  std::optional<double> scale;
  uint64_t seed = 0;
  std::string name() const;      // "kda(B=1,T=100,H=2,HV=2,K=16,V=16,C=64,h0,ht,l2norm,seed=7)"
};

// Inputs and cotangents of one case, in float64 (owning).
struct CaseData {
  CaseSpec spec;
  std::vector<int64_t> cu_seqlens;
  Tensor<double> q, k, v, g, beta, A_log, dt_bias, h0, d_o, dht;
  Inputs inputs() const;
  Cotangents cotangents() const;
  Problem problem(DType compute = DType::f64) const;
};
CaseData make_case(const CaseSpec& spec);

// Owning outputs / gradients shaped for a problem (float64 or float32).
template <class S>
struct OutputSet {
  Tensor<S> o, final_state;
  Outputs views() const { return {o.view(), final_state.view()}; }
};
template <class S>
struct GradSet {
  Tensor<S> dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias;
  Grads views() const {
    return {dq.view(), dk.view(), dv.view(), dg.view(), dbeta.view(), dh0.view(), dA_log.view(), ddt_bias.view()};
  }
};
template <class S> OutputSet<S> make_outputs(const Problem& p, bool final_state);
template <class S> GradSet<S> make_grads(const Problem& p, const Inputs& in);

// The transition of one sequence through the packed Backend API, as separate host tensors:
// (S_ext [HV,K,V], M [HV,K,K]) forward, (dS_ext, M^T) backward (d_o used only then). Host backends.
struct SeqTransition {
  Tensor<double> s, m;
};
SeqTransition sequence_transition(Backend& be, const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq,
                                  bool backward);

// The seed tests start from: KCP_SEED from the environment, else `fallback`.
uint64_t seed_from_env(uint64_t fallback);

}  // namespace kcp::val
