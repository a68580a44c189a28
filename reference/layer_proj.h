// Internal to the layer oracle: the input projections (fused in_proj or split, LoRA factors, g bias)
// with their backward, and the conversions between Tensor<S> (bshd) and token-row matrices.
//   fused: [q|k|v|g|gate] = x in_proj^T, sections (H*K, H*K, HV*V, Dg, HV*V); g / gate leave the
//          fused matrix when they have LoRA factors.   beta logits: x beta_proj^T (always its own).
// Covered by tests/reference/test_layer.cpp (finite differences of every weight).
#pragma once

#include "reference/layer.h"

namespace kcp::ref {

template <class S>
struct Projected {  // token rows; an empty matrix is a section not computed (halo: qkv only)
  Mat<S> qkv;   // [rows, Dc]
  Mat<S> g;     // [rows, Dg]
  Mat<S> gate;  // [rows, HV*V]
  Mat<S> b;     // [rows, HV]
};

template <class S> Projected<S> project(const LayerConfig& c, const LayerParams<S>& w, const Mat<S>& x, bool qkv_only);
// Adds to *dx and to the weight gradients in *dw (which must hold every weight, zero-initialised).
template <class S>
void project_backward(const LayerConfig& c, const LayerParams<S>& w, const Mat<S>& x, const Projected<S>& dp,
                      Mat<S>* dx, LayerParams<S>* dw);

// A [.., cols] tensor as a [numel/cols, cols] row matrix (copy), and back.
template <class S> Mat<S> tensor_rows(const Tensor<S>& t, int64_t cols);
template <class S> Tensor<S> rows_tensor(const Mat<S>& m, const Shape& shape);
// Adds a row matrix into a tensor of the same element count.
template <class S> void add_rows(Tensor<S>& t, const Mat<S>& m);
// The weight `name`, which must exist (error names it).
template <class S> const Tensor<S>& param(const LayerParams<S>& w, const std::string& name);

}  // namespace kcp::ref
