// Token recurrence forward/backward per head (formulas in recurrent.h). Each token costs two passes
// over the K x V state: pass 1 decays the rows and accumulates k^T S, pass 2 applies the rank-1
// update and accumulates the output, so the state is streamed twice per token instead of four times.
#include "reference/recurrent.h"

#include "reference/driver.h"

#include <type_traits>
#include <vector>

namespace kcp::ref {
namespace {

// alpha of row i at token t: per-channel gates index the row, the gdn gate is one column.
template <class S>
S alpha_at(const HeadData<S>& d, int64_t t, int64_t i) {
  return std::exp(d.a(t, d.a.cols() == 1 ? 0 : i));
}

// One recurrence step on state X [K,W] with value row vt [W]. When orow is given, also
// accumulates X_t^T q_t into it. For the delta rule, `e` receives the prediction error.
template <class S>
void state_step(const Problem& p, const HeadData<S>& d, int64_t t, const RowVec<S>& vt, Mat<S>& X,
                std::type_identity_t<RowVec<S>>* orow) {
  const int64_t K = X.rows();
  RowVec<S> delta = vt;
  if (p.delta_rule()) {
    RowVec<S> kS = RowVec<S>::Zero(X.cols());
    for (int64_t i = 0; i < K; ++i) {
      X.row(i) *= alpha_at(d, t, i);
      kS.noalias() += d.k(t, i) * X.row(i);
    }
    delta = d.beta(t) * (vt - kS);
  } else {
    for (int64_t i = 0; i < K; ++i) X.row(i) *= alpha_at(d, t, i);
  }
  if (orow) orow->setZero();
  for (int64_t i = 0; i < K; ++i) {
    X.row(i).noalias() += d.k(t, i) * delta;
    if (orow) orow->noalias() += d.q(t, i) * X.row(i);
  }
}

// Reverse step at token t. S0 = S_{t-1}; G holds dL/dS_t on entry and dL/dS_{t-1} on exit.
template <class S>
void backward_step(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, int64_t t, const Mat<S>& S0,
                   Mat<S>& G, HeadGrads<S>& g) {
  const int64_t K = S0.rows(), V = S0.cols();
  const S scale = S(p.scale);
  const RowVec<S> dot = d_o.row(t);
  RowVec<S> kS = RowVec<S>::Zero(V), Gk = RowVec<S>::Zero(V);
  // pass A: decayed state, k^T Sd, output term into G, G^T k, and Sd do for dq
  for (int64_t i = 0; i < K; ++i) {
    const auto Sd = (alpha_at(d, t, i) * S0.row(i)).eval();
    kS.noalias() += d.k(t, i) * Sd;
    G.row(i).noalias() += (scale * d.q(t, i)) * dot;
    Gk.noalias() += d.k(t, i) * G.row(i);
    g.dq(t, i) = scale * Sd.dot(dot);
  }
  RowVec<S> delta, de;
  if (p.delta_rule()) {
    const RowVec<S> e = d.v.row(t) - kS;
    delta = d.beta(t) * e;
    g.dbeta(t) = e.dot(Gk);
    de = d.beta(t) * Gk;
    g.dv.row(t) = de;
  } else {
    delta = d.v.row(t);
    de = RowVec<S>::Zero(V);
    g.dv.row(t) = Gk;
  }
  const S ddo = delta.dot(dot);
  // pass B: dq, dk, the gate gradient, and G <- Diag(alpha) (G - k de^T)
  for (int64_t i = 0; i < K; ++i) {
    const S alpha = alpha_at(d, t, i);
    const auto Sd = (alpha * S0.row(i)).eval();
    g.dq(t, i) += scale * d.k(t, i) * ddo;
    g.dk(t, i) = G.row(i).dot(delta) - Sd.dot(de);
    G.row(i).noalias() -= d.k(t, i) * de;
    const S dai = G.row(i).dot(Sd);
    if (d.a.cols() == 1) g.da(t, 0) += dai; else g.da(t, i) = dai;
    if (g.da_abs.size()) g.da_abs(t, d.a.cols() == 1 ? 0 : i) += G.row(i).cwiseProduct(Sd).cwiseAbs().sum();
    G.row(i) *= alpha;
  }
}

}  // namespace

template <class S>
void recurrent_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht) {
  const int64_t L = d.seq.len;
  ht = d.h0;
  o.resize(L, p.V);
  RowVec<S> orow(p.V);
  for (int64_t t = 0; t < L; ++t) {
    state_step(p, d, t, RowVec<S>(d.v.row(t)), ht, &orow);
    o.row(t) = S(p.scale) * orow;
  }
}

template <class S>
void recurrent_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht,
                             HeadGrads<S>& g) {
  const int64_t L = d.seq.len, C = p.chunk_size, nseg = (L + C - 1) / C;
  g.dq = Mat<S>::Zero(L, p.K);
  g.dk = Mat<S>::Zero(L, p.K);
  g.dv = Mat<S>::Zero(L, p.V);
  g.da = Mat<S>::Zero(L, d.a.cols());
  if (g.da_abs.size()) g.da_abs = Mat<S>::Zero(L, d.a.cols());
  g.dbeta = Vec<S>::Zero(p.delta_rule() ? L : 0);
  // checkpoints: ck[s] = state entering segment s
  std::vector<Mat<S>> ck(static_cast<size_t>(nseg));
  Mat<S> X = d.h0;
  for (int64_t t = 0; t < L; ++t) {
    if (t % C == 0) ck[size_t(t / C)] = X;
    state_step(p, d, t, RowVec<S>(d.v.row(t)), X, nullptr);
  }
  Mat<S> G = dht;
  std::vector<Mat<S>> states(static_cast<size_t>(std::min(C, std::max<int64_t>(L, 1))));
  for (int64_t s = nseg - 1; s >= 0; --s) {
    const int64_t t0 = s * C, t1 = std::min(L, t0 + C);
    X = ck[size_t(s)];
    for (int64_t t = t0; t < t1; ++t) {
      states[size_t(t - t0)] = X;
      state_step(p, d, t, RowVec<S>(d.v.row(t)), X, nullptr);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) backward_step(p, d, d_o, t, states[size_t(t - t0)], G, g);
  }
  g.dh0 = G;
}

template <class S>
void recurrent_transition_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& s_ext, Mat<S>& m) {
  const int64_t K = p.K, V = p.V;
  Mat<S> X = Mat<S>::Zero(K, V + K);  // [S_ext | M] from [0 | I]
  X.rightCols(K).setIdentity();
  RowVec<S> vt = RowVec<S>::Zero(V + K);
  for (int64_t t = 0; t < d.seq.len; ++t) {
    vt.head(V) = d.v.row(t);
    state_step(p, d, t, vt, X, nullptr);
  }
  s_ext = X.leftCols(V);
  m = X.rightCols(K);
}

template <class S>
void recurrent_transition_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                        Mat<S>& ds_ext, Mat<S>& m_t) {
  const int64_t K = p.K;
  Mat<S> G = Mat<S>::Zero(K, p.V);
  for (int64_t t = d.seq.len - 1; t >= 0; --t) {
    G.noalias() += (S(p.scale) * d.q.row(t)).transpose() * d_o.row(t);
    if (p.delta_rule()) {  // M_t^T G = Diag(alpha) (I - beta k k^T) G
      const RowVec<S> kG = d.k.row(t) * G;
      G.noalias() -= (d.beta(t) * d.k.row(t)).transpose() * kG;
    }
    for (int64_t i = 0; i < K; ++i) G.row(i) *= alpha_at(d, t, i);
  }
  ds_ext = G;
  Mat<S> s_ext, m;
  recurrent_transition_forward_head(p, d, s_ext, m);
  m_t = m.transpose();
}

Tensor<double> recurrent_dg_magnitude(const Problem& p, const Inputs& in, const Cotangents& dc) {
  Tensor<double> out(shape_g(p));
  const int64_t Kg = gate_width(p);
  parallel_tasks(p.N * p.HV, [&](int64_t task) {
    const int64_t n = task / p.HV, hv = task % p.HV;
    const HeadData<double> d = load_head<double>(p, in, n, hv);
    const HeadCotangents<double> ct = load_head_cotangents(p, dc, d);
    HeadGrads<double> g;
    g.da_abs = Mat<double>::Zero(1, 1);  // ask for the magnitudes
    recurrent_backward_head(p, d, ct.d_o, ct.dht, g);
    for (int64_t t = 0; t < d.seq.len; ++t)
      for (int64_t i = 0; i < Kg; ++i) {
        double unused = 0;  // |d gate / d x| is the gate's backward of a unit da
        const double slope = p.flags.use_gate_in_kernel ? std::abs(gate_backward(d.gate, d.gate_x(t, i), 1.0, &unused)) : 1.0;
        out.data()[((d.seq.b * p.T + d.seq.t0 + t) * p.HV + hv) * Kg + i] = slope * g.da_abs(t, i);
      }
  });
  return out;
}

#define KCP_INSTANTIATE(S)                                                                                  \
  template void recurrent_forward_head<S>(const Problem&, const HeadData<S>&, Mat<S>&, Mat<S>&);            \
  template void recurrent_backward_head<S>(const Problem&, const HeadData<S>&, const Mat<S>&, const Mat<S>&, \
                                           HeadGrads<S>&);                                                  \
  template void recurrent_transition_forward_head<S>(const Problem&, const HeadData<S>&, Mat<S>&, Mat<S>&); \
  template void recurrent_transition_backward_head<S>(const Problem&, const HeadData<S>&, const Mat<S>&,    \
                                                      Mat<S>&, Mat<S>&);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
