// The ops the layer adds around the kernel (ALGORITHMS.md section 7), each with its backward, on
// token-row matrices (one row per token, row-major; heads side by side in the columns):
//   linear:      y = x W^T                         dx += dy W,  dW = dy^T x       W [out, in] (torch)
//   l2norm:      y = x rstd per head of D columns,  rstd = 1/sqrt(sum x^2 + eps)
//                dx = rstd (dy - (dy . y) y)
//   rms gated:   n = o r w,  r = 1/sqrt(mean_V o^2 + eps) per head of V columns,  y = n act(z)
//                act = sigmoid (KDA) or silu (GDN);  dw = sum dy act(z) o r
//                do = r (dn w - o r^2 mean(dn w o)),  dz = dy n act'(z)
//   sigmoid:     b = sigmoid(r),  dr = db b (1 - b)
// Covered by tests/reference/test_layer_ops.cpp (finite differences of each op).
#pragma once

#include <cstdint>

#include "reference/eigen_types.h"

namespace kcp::ref {

enum class OutputGate { sigmoid, silu };

template <class S> Mat<S> linear_forward(const Mat<S>& x, const Mat<S>& w);
// Adds dy W to *dx (when given) and adds dy^T x to *dw (when given).
template <class S> void linear_backward(const Mat<S>& x, const Mat<S>& w, const Mat<S>& dy, Mat<S>* dx, Mat<S>* dw);

// rstd [rows, heads] is returned for the backward.
template <class S> Mat<S> l2norm_forward(const Mat<S>& x, int64_t D, S eps, Mat<S>* rstd);
template <class S> Mat<S> l2norm_backward(const Mat<S>& y, const Mat<S>& rstd, const Mat<S>& dy, int64_t D);

template <class S>
struct RmsGated {
  Mat<S> n;  // [rows, HV*V] normalised and scaled by w, before the gate
  Mat<S> y;  // [rows, HV*V] n * act(z)
};
template <class S>
RmsGated<S> rms_gated_forward(const Mat<S>& o, const Vec<S>& w, const Mat<S>& z, int64_t V, S eps, OutputGate act);
// Writes d_o and dz; adds to dw.
template <class S>
void rms_gated_backward(const Mat<S>& o, const Vec<S>& w, const Mat<S>& z, int64_t V, S eps, OutputGate act,
                        const Mat<S>& dy, Mat<S>* d_o, Mat<S>* dz, Vec<S>* dw);

template <class S> Mat<S> sigmoid_forward(const Mat<S>& r);
template <class S> Mat<S> sigmoid_backward(const Mat<S>& b, const Mat<S>& db);

}  // namespace kcp::ref
