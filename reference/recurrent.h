// Token recurrence, forward and backward: the specification every backend is checked against.
// Per (sequence, value head), state S [K,V], alpha_t = exp(a_t) (scalar for gdn, K-vector otherwise):
//   gdn/kda:  Sd = Diag(alpha_t) S;  e = v_t - Sd^T k_t;  S = Sd + beta_t k_t e^T   (forget, then error)
//   gla:      S = Diag(alpha_t) S + k_t v_t^T
//   o_t = S^T (scale q_t)
// Backward (ALGORITHMS.md 3.2) runs reverse time over segments of C tokens: the forward keeps S only
// at segment starts and recomputes the C states of a segment before walking it backwards, so memory
// is (T/C + C) K V per head instead of T K V.
// Transitions: the same recursion on [S | M] with values [v | 0] from [0 | I] gives (S_ext, M);
// the backward chain is G <- M_t^T (G + scale q_t do_t^T) from G = 0.
// Covered by tests/reference/test_recurrent.cpp, test_gradients.cpp, test_golden_reference.cpp.
#pragma once

#include "reference/head_io.h"

namespace kcp::ref {

template <class S> void recurrent_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht);
template <class S>
void recurrent_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht,
                             HeadGrads<S>& g);
template <class S>
void recurrent_transition_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& s_ext, Mat<S>& m);
template <class S>
void recurrent_transition_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                        Mat<S>& ds_ext, Mat<S>& m_t);

// Magnitude behind each element of the raw-gate gradient dg: |d gate / d x| * sum over the terms of
// da_t of their absolute values, shaped like g. Float64 only; used to scale float32 tolerances by
// the conditioning of dg (validation/float_rule.h). Covered by tests/validation/test_float_rule.cpp.
Tensor<double> recurrent_dg_magnitude(const Problem& p, const Inputs& in, const Cotangents& dc);

// The per-head algorithm as a "core" for the drivers in driver.h.
struct RecurrentCore {
  template <class S> void forward(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht) const {
    recurrent_forward_head(p, d, o, ht);
  }
  template <class S>
  void backward(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht, HeadGrads<S>& g) const {
    recurrent_backward_head(p, d, d_o, dht, g);
  }
  template <class S> void transition_forward(const Problem& p, const HeadData<S>& d, Mat<S>& s, Mat<S>& m) const {
    recurrent_transition_forward_head(p, d, s, m);
  }
  template <class S>
  void transition_backward(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, Mat<S>& ds, Mat<S>& mt) const {
    recurrent_transition_backward_head(p, d, d_o, ds, mt);
  }
};

}  // namespace kcp::ref
