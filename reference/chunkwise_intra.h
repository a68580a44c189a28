// Gated intra-chunk products of the chunkwise algorithm, D_rs = exp(B_r - B_s) (B: chunk-local
// cumsum of the log decay, chunkwise.h ChunkGate), for one chunk of len rows and K channels:
//   gated_gram:          A[r,s] = sum_d X_r[d] Y_s[d] D_rs[d]    s < r (strict) or s <= r  [len,len]
//   gated_gram_backward: given M = dL/dA (lower part read),  dX_r = sum_s M_rs Y_s D_rs,
//                        dY_s = sum_r M_rs X_r D_rs  [len,K],  and da [len,Kg], the gradient w.r.t.
//                        the per-token log decay a, as rectangle sums
//                        da_t = sum_{r >= t > s} M_rs X_r Y_s D_rs   (diagonal pairs carry none).
// FLA forms da as the reverse cumsum of X dX - Y dY; pairs with r, s >= t then enter twice with
// opposite signs, which in float32 leaves only rounding of a small da_t under strong decay. The
// rectangle sums add each pair once.
// Scalar gate (gdn): D is a [len,len] matrix and the products are masked GEMMs. Per-channel gate (kda,
// gla): sub-chunks of kSubChunk rows; an off-diagonal block (rows in sub-chunk i, columns in j < i)
// factors D_rs = sub_row[r] * f_ij * sub_col[s] with f_ij = exp(B_{n_i} - B_{n_{j+1}}) (n_b = first
// row of sub-chunk b), every factor <= 1, so the block is one GEMM and nothing overflows; a diagonal
// block uses running products of exp(a).
// Covered by tests/chunkwise/test_stages.cpp (against direct sums) and the end-to-end tests.
#pragma once

#include "reference/chunkwise.h"

namespace kcp::ref {

template <class S> Mat<S> gated_gram(const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g, bool diagonal);
template <class S> struct GramGrads { Mat<S> dX, dY, da; };  // [len,K], [len,K], [len,Kg]
// A: the forward's gated_gram(X, Y, g, diagonal) when at hand (the scalar gate needs it for da).
template <class S>
GramGrads<S> gated_gram_backward(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                                 bool diagonal, const Mat<S>* A = nullptr);

// X * G for a gate-shaped G [len,Kg]: per-channel product, or each row scaled when Kg = 1.
template <class S>
Mat<S> gate_mul(const Mat<S>& X, const Mat<S>& G) {
  if (G.cols() == 1)  // a one-column row-major G is contiguous: map it so the row scaling vectorizes
    return X.array().colwise() * Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(G.data(), G.rows());
  return X.array() * G.array();
}
// A channel-resolved gate gradient [len,K] reduced to the gate's width Kg (sum over d when Kg = 1).
template <class S>
Mat<S> gate_reduce(const Mat<S>& dB, int64_t Kg) {
  if (Kg == 1) return dB.rowwise().sum();
  return dB;
}

}  // namespace kcp::ref
