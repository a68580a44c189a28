// Loading one head's rows from the views with the fused pre-processing, and chaining its gradients
// back through that pre-processing (formulas in gates.h).
#include "reference/head_io.h"

#include <utility>

namespace kcp::ref {

template <class S>
Mat<S> load_rows(const TensorView& t, const SeqRange& s, int64_t x, int64_t D) {
  Mat<S> m(s.len, D);
  for (int64_t r = 0; r < s.len; ++r)
    view_load<S>(t, s.b * t.stride[0] + (s.t0 + r) * t.stride[1] + x * t.stride[2], D, t.stride[3], m.row(r).data());
  return m;
}

template <class S>
void store_rows(const TensorView& t, const SeqRange& s, int64_t x, const Mat<S>& m) {
  for (int64_t r = 0; r < s.len; ++r)
    view_store<S>(t, s.b * t.stride[0] + (s.t0 + r) * t.stride[1] + x * t.stride[2], m.cols(), t.stride[3],
                  m.row(r).data());
}

template <class S>
Vec<S> load_scalars(const TensorView& t, const SeqRange& s, int64_t x) {
  Vec<S> m(s.len);
  view_load<S>(t, s.b * t.stride[0] + s.t0 * t.stride[1] + x * t.stride[2], s.len, t.stride[1], m.data());
  return m;
}

template <class S>
void store_scalars(const TensorView& t, const SeqRange& s, int64_t x, const Vec<S>& m) {
  view_store<S>(t, s.b * t.stride[0] + s.t0 * t.stride[1] + x * t.stride[2], s.len, t.stride[1], m.data());
}

template <class S>
Mat<S> load_state(const TensorView& t, int64_t n, int64_t hv, int64_t K, int64_t V, bool v_first) {
  Mat<S> m(K, V);
  const int64_t row_step = v_first ? t.stride[3] : t.stride[2], col_step = v_first ? t.stride[2] : t.stride[3];
  for (int64_t i = 0; i < K; ++i)
    view_load<S>(t, n * t.stride[0] + hv * t.stride[1] + i * row_step, V, col_step, m.row(i).data());
  return m;
}

template <class S>
void store_state(const TensorView& t, int64_t n, int64_t hv, const Mat<S>& m, bool v_first) {
  const int64_t row_step = v_first ? t.stride[3] : t.stride[2], col_step = v_first ? t.stride[2] : t.stride[3];
  for (int64_t i = 0; i < m.rows(); ++i)
    view_store<S>(t, n * t.stride[0] + hv * t.stride[1] + i * row_step, m.cols(), col_step, m.row(i).data());
}

namespace {

// y = x * rstd per row, rstd = 1/sqrt(sum x^2 + eps); returns rstd.
template <class S>
Vec<S> l2norm_rows(Mat<S>& x) {
  Vec<S> rstd(x.rows());
  for (int64_t r = 0; r < x.rows(); ++r) {
    rstd(r) = S(1) / std::sqrt(x.row(r).squaredNorm() + S(kL2NormEps));
    x.row(r) *= rstd(r);
  }
  return rstd;
}

// dx = rstd (dy - (dy . y) y) per row.
template <class S>
Mat<S> l2norm_rows_backward(const Mat<S>& y, const Vec<S>& rstd, const Mat<S>& dy) {
  Mat<S> dx(y.rows(), y.cols());
  for (int64_t r = 0; r < y.rows(); ++r) dx.row(r) = rstd(r) * (dy.row(r) - dy.row(r).dot(y.row(r)) * y.row(r));
  return dx;
}

template <class S>
GateParams<S> gate_params(const Problem& p, const Inputs& in, int64_t hv) {
  GateParams<S> gp;
  gp.formula = p.gate_formula();
  gp.has_A_log = !in.A_log.empty();
  if (gp.has_A_log) gp.A_log = S(in.A_log.get(hv * in.A_log.stride[0]));
  if (p.flags.lower_bound) gp.lower_bound = S(*p.flags.lower_bound);
  return gp;
}

}  // namespace

template <class S>
HeadData<S> load_head(const Problem& p, const Inputs& in, int64_t n, int64_t hv) {
  HeadData<S> d;
  d.n = n, d.hv = hv, d.h = hv / p.G(), d.seq = p.sequence(n);
  d.q = load_rows<S>(in.q, d.seq, d.h, p.K);
  d.k = load_rows<S>(in.k, d.seq, d.h, p.K);
  d.v = load_rows<S>(in.v, d.seq, hv, p.V);
  if (p.flags.use_qk_l2norm_in_kernel) {
    d.q_rstd = l2norm_rows(d.q);
    d.k_rstd = l2norm_rows(d.k);
  }
  const int64_t Kg = gate_width(p);
  Mat<S> g = p.per_channel_gate() ? load_rows<S>(in.g, d.seq, hv, Kg) : Mat<S>(load_scalars<S>(in.g, d.seq, hv));
  d.gate = gate_params<S>(p, in, hv);
  if (p.flags.use_gate_in_kernel) {
    if (!in.dt_bias.empty()) {
      Vec<S> bias(Kg);
      view_load<S>(in.dt_bias, hv * Kg * in.dt_bias.stride[0], Kg, in.dt_bias.stride[0], bias.data());
      g.rowwise() += bias.transpose();
    }
    d.gate_x = g;
    d.a = g.unaryExpr([&](S x) { return gate_forward(d.gate, x); });
  } else {
    d.a = std::move(g);
  }
  if (p.delta_rule()) {
    d.beta = load_scalars<S>(in.beta, d.seq, hv);
    if (p.flags.use_beta_sigmoid_in_kernel) {
      d.beta_raw = d.beta;
      const S s = beta_scale<S>(p.flags);
      d.beta = d.beta_raw.unaryExpr([&](S x) { return s * sigmoid(x); });
    }
  }
  d.h0 = in.initial_state.empty() ? Mat<S>(Mat<S>::Zero(p.K, p.V))
                                  : load_state<S>(in.initial_state, n, hv, p.K, p.V, p.flags.state_v_first);
  return d;
}

template <class S>
HeadCotangents<S> load_head_cotangents(const Problem& p, const Cotangents& dc, const HeadData<S>& d) {
  HeadCotangents<S> c;
  c.d_o = load_rows<S>(dc.d_o, d.seq, d.hv, p.V);
  c.dht = dc.d_final_state.empty() ? Mat<S>(Mat<S>::Zero(p.K, p.V))
                                   : load_state<S>(dc.d_final_state, d.n, d.hv, p.K, p.V, p.flags.state_v_first);
  return c;
}

template <class S>
HeadInputGrads<S> chain_to_inputs(const Problem& p, const HeadData<S>& d, HeadGrads<S>&& g) {
  HeadInputGrads<S> r;
  if (p.flags.use_qk_l2norm_in_kernel) {
    r.dq = l2norm_rows_backward(d.q, d.q_rstd, g.dq);
    r.dk = l2norm_rows_backward(d.k, d.k_rstd, g.dk);
  } else {
    r.dq = std::move(g.dq);
    r.dk = std::move(g.dk);
  }
  r.dv = std::move(g.dv);
  r.dh0 = std::move(g.dh0);
  const int64_t L = g.da.rows(), Kg = g.da.cols();
  r.ddt_bias = Vec<S>::Zero(Kg);
  if (p.flags.use_gate_in_kernel) {
    r.dg.resize(L, Kg);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Kg; ++i) {
        r.dg(t, i) = gate_backward(d.gate, d.gate_x(t, i), g.da(t, i), &r.dA_log);
        r.ddt_bias(i) += r.dg(t, i);
      }
  } else {
    r.dg = std::move(g.da);
  }
  r.dbeta = std::move(g.dbeta);
  if (p.flags.use_beta_sigmoid_in_kernel) {
    const S s = beta_scale<S>(p.flags);
    for (int64_t t = 0; t < L; ++t) {
      const S sg = sigmoid(d.beta_raw(t));
      r.dbeta(t) *= s * sg * (S(1) - sg);
    }
  }
  return r;
}

#define KCP_INSTANTIATE(S)                                                                               \
  template Mat<S> load_rows<S>(const TensorView&, const SeqRange&, int64_t, int64_t);                    \
  template void store_rows<S>(const TensorView&, const SeqRange&, int64_t, const Mat<S>&);               \
  template Vec<S> load_scalars<S>(const TensorView&, const SeqRange&, int64_t);                          \
  template void store_scalars<S>(const TensorView&, const SeqRange&, int64_t, const Vec<S>&);            \
  template Mat<S> load_state<S>(const TensorView&, int64_t, int64_t, int64_t, int64_t, bool);             \
  template void store_state<S>(const TensorView&, int64_t, int64_t, const Mat<S>&, bool);                \
  template HeadData<S> load_head<S>(const Problem&, const Inputs&, int64_t, int64_t);                    \
  template HeadCotangents<S> load_head_cotangents<S>(const Problem&, const Cotangents&, const HeadData<S>&); \
  template HeadInputGrads<S> chain_to_inputs<S>(const Problem&, const HeadData<S>&, HeadGrads<S>&&);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
