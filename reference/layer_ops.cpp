// The layer's own ops (formulas in layer_ops.h). Plain Eigen products and per-row loops; rows are
// independent, so every output element has one writer and results do not depend on threads.
#include "reference/layer_ops.h"

#include <cmath>

#include "core/error.h"
#include "reference/gates.h"

namespace kcp::ref {

template <class S>
Mat<S> linear_forward(const Mat<S>& x, const Mat<S>& w) {
  KCP_CHECK(x.cols() == w.cols(), "linear: input width ", x.cols(), " but weight [", w.rows(), ",", w.cols(), "]");
  return x * w.transpose();
}

template <class S>
void linear_backward(const Mat<S>& x, const Mat<S>& w, const Mat<S>& dy, Mat<S>* dx, Mat<S>* dw) {
  if (dx) *dx += dy * w;
  if (dw) *dw += dy.transpose() * x;
}

template <class S>
Mat<S> l2norm_forward(const Mat<S>& x, int64_t D, S eps, Mat<S>* rstd) {
  KCP_CHECK(x.cols() % D == 0, "l2norm: width ", x.cols(), " is not a multiple of the head dim ", D);
  const int64_t heads = x.cols() / D;
  Mat<S> y(x.rows(), x.cols());
  rstd->resize(x.rows(), heads);
  for (int64_t r = 0; r < x.rows(); ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const S s = S(1) / std::sqrt(x.row(r).segment(h * D, D).squaredNorm() + eps);
      (*rstd)(r, h) = s;
      y.row(r).segment(h * D, D) = x.row(r).segment(h * D, D) * s;
    }
  return y;
}

template <class S>
Mat<S> l2norm_backward(const Mat<S>& y, const Mat<S>& rstd, const Mat<S>& dy, int64_t D) {
  Mat<S> dx(y.rows(), y.cols());
  for (int64_t r = 0; r < y.rows(); ++r)
    for (int64_t h = 0; h < rstd.cols(); ++h) {
      const auto yh = y.row(r).segment(h * D, D);
      const auto dyh = dy.row(r).segment(h * D, D);
      dx.row(r).segment(h * D, D) = rstd(r, h) * (dyh - dyh.dot(yh) * yh);
    }
  return dx;
}

namespace {

template <class S> S gate_act(S z, OutputGate a) { return a == OutputGate::sigmoid ? sigmoid(z) : z * sigmoid(z); }
template <class S> S gate_act_grad(S z, OutputGate a) {
  const S s = sigmoid(z);
  return a == OutputGate::sigmoid ? s * (S(1) - s) : s * (S(1) + z * (S(1) - s));
}

}  // namespace

template <class S>
RmsGated<S> rms_gated_forward(const Mat<S>& o, const Vec<S>& w, const Mat<S>& z, int64_t V, S eps, OutputGate act) {
  KCP_CHECK(o.cols() % V == 0 && w.size() == V && z.rows() == o.rows() && z.cols() == o.cols(),
            "rms_gated: o [", o.rows(), ",", o.cols(), "], norm weight [", w.size(), "], gate [", z.rows(), ",",
            z.cols(), "] do not fit V = ", V);
  RmsGated<S> r{Mat<S>(o.rows(), o.cols()), Mat<S>(o.rows(), o.cols())};
  for (int64_t t = 0; t < o.rows(); ++t)
    for (int64_t h = 0; h < o.cols() / V; ++h) {
      const auto oh = o.row(t).segment(h * V, V);
      const S rs = S(1) / std::sqrt(oh.squaredNorm() / S(V) + eps);
      for (int64_t j = 0; j < V; ++j) {
        const int64_t c = h * V + j;
        r.n(t, c) = o(t, c) * rs * w(j);
        r.y(t, c) = r.n(t, c) * gate_act(z(t, c), act);
      }
    }
  return r;
}

template <class S>
void rms_gated_backward(const Mat<S>& o, const Vec<S>& w, const Mat<S>& z, int64_t V, S eps, OutputGate act,
                        const Mat<S>& dy, Mat<S>* d_o, Mat<S>* dz, Vec<S>* dw) {
  d_o->resize(o.rows(), o.cols());
  dz->resize(o.rows(), o.cols());
  Vec<S> dn(V);
  for (int64_t t = 0; t < o.rows(); ++t)
    for (int64_t h = 0; h < o.cols() / V; ++h) {
      const auto oh = o.row(t).segment(h * V, V);
      const S rs = S(1) / std::sqrt(oh.squaredNorm() / S(V) + eps);
      S mean_dno = 0;  // mean over V of (dn w) o
      for (int64_t j = 0; j < V; ++j) {
        const int64_t c = h * V + j;
        const S a = gate_act(z(t, c), act), n = o(t, c) * rs * w(j);
        dn(j) = dy(t, c) * a;
        (*dz)(t, c) = dy(t, c) * n * gate_act_grad(z(t, c), act);
        (*dw)(j) += dn(j) * o(t, c) * rs;
        mean_dno += dn(j) * w(j) * o(t, c);
      }
      mean_dno /= S(V);
      for (int64_t j = 0; j < V; ++j) {
        const int64_t c = h * V + j;
        (*d_o)(t, c) = rs * (dn(j) * w(j) - o(t, c) * rs * rs * mean_dno);
      }
    }
}

template <class S>
Mat<S> sigmoid_forward(const Mat<S>& r) {
  return r.unaryExpr([](S x) { return sigmoid(x); });
}

template <class S>
Mat<S> sigmoid_backward(const Mat<S>& b, const Mat<S>& db) {
  return db.cwiseProduct(b.unaryExpr([](S x) { return x * (S(1) - x); }));
}

#define KCP_LAYER_OPS(S)                                                                                        \
  template Mat<S> linear_forward(const Mat<S>&, const Mat<S>&);                                                \
  template void linear_backward(const Mat<S>&, const Mat<S>&, const Mat<S>&, Mat<S>*, Mat<S>*);                \
  template Mat<S> l2norm_forward(const Mat<S>&, int64_t, S, Mat<S>*);                                          \
  template Mat<S> l2norm_backward(const Mat<S>&, const Mat<S>&, const Mat<S>&, int64_t);                       \
  template RmsGated<S> rms_gated_forward(const Mat<S>&, const Vec<S>&, const Mat<S>&, int64_t, S, OutputGate); \
  template void rms_gated_backward(const Mat<S>&, const Vec<S>&, const Mat<S>&, int64_t, S, OutputGate,        \
                                   const Mat<S>&, Mat<S>*, Mat<S>*, Vec<S>*);                                  \
  template Mat<S> sigmoid_forward(const Mat<S>&);                                                              \
  template Mat<S> sigmoid_backward(const Mat<S>&, const Mat<S>&);
KCP_LAYER_OPS(double)
KCP_LAYER_OPS(float)
#undef KCP_LAYER_OPS

}  // namespace kcp::ref
