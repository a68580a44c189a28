// Per-(sequence, value head) data that every CPU algorithm works on, and the pre-/post-processing
// around it: load the rows of one head from the views, apply the fused L2 norm, beta sigmoid and
// gate activation (gates.h), and after a backward chain the head's gradients back to the inputs as
// passed. The algorithms (recurrent.h, chunkwise.h) only see HeadData -> HeadOut / HeadGrads.
//   HeadData: q,k [L,K] (kernel inputs), v [L,V], a [L,Kg] natural-log decay (Kg = K or 1 for gdn),
//             beta [L], h0 [K,V] (K-major even with state_v_first).
// Covered by tests/reference/test_recurrent.cpp and test_gradients.cpp.
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "reference/eigen_types.h"
#include "reference/gates.h"

namespace kcp::ref {

template <class S>
struct HeadData {
  int64_t n = 0, hv = 0, h = 0;  // sequence, value head, its q/k head
  SeqRange seq{};
  Mat<S> q, k;     // [L,K] after the fused L2 norm when enabled
  Mat<S> v;        // [L,V]
  Mat<S> a;        // [L,Kg] log decay per step
  Vec<S> beta;     // [L] effective beta (after the fused sigmoid); size 0 for gla
  Mat<S> h0;       // [K,V] initial state, zero when none
  // kept for the backward of the fused pre-processing
  Vec<S> q_rstd, k_rstd;  // [L] (only with the L2 norm)
  Mat<S> gate_x;          // [L,Kg] g + dt_bias (only with the fused gate)
  Vec<S> beta_raw;        // [L] (only with the fused sigmoid)
  GateParams<S> gate;
};

template <class S>
struct HeadGrads {  // gradients w.r.t. the HeadData quantities
  Mat<S> dq, dk;   // [L,K]
  Mat<S> dv;       // [L,V]
  Mat<S> da;       // [L,Kg]
  Vec<S> dbeta;    // [L]
  Mat<S> dh0;      // [K,V]
  // Optional (the oracle fills it when the caller sizes it non-empty): sum of the magnitudes of
  // the terms of each da, the scale its rounding error is relative to (validation/float_rule.h).
  Mat<S> da_abs;   // [L,Kg]
};

inline int64_t gate_width(const Problem& p) { return p.per_channel_gate() ? p.K : 1; }

template <class S> HeadData<S> load_head(const Problem& p, const Inputs& in, int64_t n, int64_t hv);

// Row-block access to [B,T,X,D] views for one (sequence, head): rows t0..t0+L of head x.
template <class S> Mat<S> load_rows(const TensorView& t, const SeqRange& s, int64_t x, int64_t D);
template <class S> void store_rows(const TensorView& t, const SeqRange& s, int64_t x, const Mat<S>& m);
template <class S> Vec<S> load_scalars(const TensorView& t, const SeqRange& s, int64_t x);    // [B,T,X]
template <class S> void store_scalars(const TensorView& t, const SeqRange& s, int64_t x, const Vec<S>& m);
// States [N,HV,K,V] (or [N,HV,V,K] with state_v_first) <-> K-major [K,V].
template <class S> Mat<S> load_state(const TensorView& t, int64_t n, int64_t hv, int64_t K, int64_t V, bool v_first);
template <class S> void store_state(const TensorView& t, int64_t n, int64_t hv, const Mat<S>& m, bool v_first);

// The cotangents of one head: do rows [L,V] and dht [K,V] (zero when absent).
template <class S>
struct HeadCotangents {
  Mat<S> d_o, dht;
};
template <class S> HeadCotangents<S> load_head_cotangents(const Problem& p, const Cotangents& dc, const HeadData<S>& d);

// Gradients of one head w.r.t. the inputs as passed (before the fused pre-processing).
template <class S>
struct HeadInputGrads {
  Mat<S> dq, dk;      // [L,K] w.r.t. raw q,k of head h (this value head's share)
  Mat<S> dv;          // [L,V]
  Mat<S> dh0;         // [K,V]
  Mat<S> dg;          // [L,Kg]
  Vec<S> dbeta;       // [L]
  S dA_log = 0;       // this head's partial sum
  Vec<S> ddt_bias;    // [Kg] partial sum
};
// Consumes `g` (its tensors move into the result, so a long sequence is not held twice).
template <class S> HeadInputGrads<S> chain_to_inputs(const Problem& p, const HeadData<S>& d, HeadGrads<S>&& g);

}  // namespace kcp::ref
