// Gated intra-chunk products (formulas and the sub-chunk factorization in chunkwise_intra.h).
// Off-diagonal sub-chunk blocks of block row i are done as one GEMM against the stacked,
// rescaled rows of all earlier sub-chunks; diagonal blocks walk running products of step = exp(a),
// which needs no exponential per (r, s) pair. The rectangle sums of the gate gradient are built from
// per-row pieces (suffix / prefix sums inside a sub-chunk) and whole-block totals.
#include "reference/chunkwise_intra.h"

#include <vector>

namespace kcp::ref {
namespace {

struct SubChunks {
  int64_t len, n;  // rows, sub-chunks
  int64_t first(int64_t b) const { return b * kSubChunk; }
  int64_t rows(int64_t b) const { return std::min(kSubChunk, len - b * kSubChunk); }
};

SubChunks sub_chunks(int64_t len) { return {len, (len + kSubChunk - 1) / kSubChunk}; }

// f_ij = exp(B_{n_i} - B_{n_{j+1}}) for j < i, as a row [K].
template <class S>
const RowVec<S>& cross_factor(const ChunkGate<S>& g, const SubChunks& sc, int64_t i, int64_t j) {
  return g.cross[size_t(i * sc.n + j)];
}

// Z = [Yb_0 * f_i0; ...; Yb_{i-1} * f_{i,i-1}]  [n_i, K], Yb = Y * sub_col.
template <class S>
Mat<S> stacked_columns(const Mat<S>& Yb, const ChunkGate<S>& g, const SubChunks& sc, int64_t i) {
  Mat<S> Z(sc.first(i), Yb.cols());
  for (int64_t j = 0; j < i; ++j) {
    const RowVec<S>& f = cross_factor(g, sc, i, j);
    Z.middleRows(sc.first(j), sc.rows(j)) = Yb.middleRows(sc.first(j), sc.rows(j)).array().rowwise() * f.array();
  }
  return Z;
}

template <class S>
Mat<S> gram_channels(const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g, bool diagonal) {
  const int64_t L = X.rows();
  const SubChunks sc = sub_chunks(L);
  Mat<S> A = Mat<S>::Zero(L, L);
  const Mat<S> Xa = X.cwiseProduct(g.sub_row), Yb = Y.cwiseProduct(g.sub_col);
  for (int64_t i = 1; i < sc.n; ++i) {
    const Mat<S> Z = stacked_columns(Yb, g, sc, i);
    A.block(sc.first(i), 0, sc.rows(i), sc.first(i)).noalias() = Xa.middleRows(sc.first(i), sc.rows(i)) * Z.transpose();
  }
  RowVec<S> xd(X.cols());
  for (int64_t i = 0; i < sc.n; ++i)
    for (int64_t r = sc.first(i); r < sc.first(i) + sc.rows(i); ++r) {
      xd = X.row(r);
      if (diagonal) A(r, r) = xd.dot(Y.row(r));
      for (int64_t s = r - 1; s >= sc.first(i); --s) {
        xd.array() *= g.step.row(s + 1).array();
        A(r, s) = xd.dot(Y.row(s));
      }
    }
  return A;
}

// Off-diagonal sub-chunk blocks of the backward: dX, dY, and the per-row pieces of the rectangle
// sums, rowoff_r = X_r dX_r (pairs (r, s) with s in an earlier sub-chunk), coloff_s = Y_s dY_s (pairs
// with r in a later sub-chunk), and whole-block totals tot[i*n + j] (pairs of sub-chunks i > j).
template <class S>
void gram_backward_blocks(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                          const SubChunks& sc, GramGrads<S>& r, Mat<S>& rowoff, Mat<S>& coloff,
                          std::vector<RowVec<S>>& tot) {
  const Mat<S> Xa = X.cwiseProduct(g.sub_row), Yb = Y.cwiseProduct(g.sub_col);
  for (int64_t i = 1; i < sc.n; ++i) {
    const int64_t ni = sc.first(i), Li = sc.rows(i);
    const auto Mi = M.block(ni, 0, Li, ni);
    const Mat<S> R = Mi * stacked_columns(Yb, g, sc, i);  // sum_j (M_ij Yb_j) f_ij
    r.dX.middleRows(ni, Li) = R.cwiseProduct(g.sub_row.middleRows(ni, Li));
    rowoff.middleRows(ni, Li) = R.cwiseProduct(Xa.middleRows(ni, Li));
    const Mat<S> U = Mi.transpose() * Xa.middleRows(ni, Li);  // [n_i,K], rows of every j < i
    for (int64_t j = 0; j < i; ++j) {
      const int64_t nj = sc.first(j), Lj = sc.rows(j);
      const Mat<S> Uf = U.middleRows(nj, Lj).array().rowwise() * cross_factor(g, sc, i, j).array();
      r.dY.middleRows(nj, Lj) += Uf.cwiseProduct(g.sub_col.middleRows(nj, Lj));
      const Mat<S> col = Uf.cwiseProduct(Yb.middleRows(nj, Lj));
      coloff.middleRows(nj, Lj) += col;
      tot[size_t(i * sc.n + j)] = col.colwise().sum();
    }
  }
}

// Diagonal sub-chunk blocks: running products D_rs over s = r-1 .. n_b; rect_t collects the pairs
// r >= t > s of the same sub-chunk.
template <class S>
void gram_backward_diagonal(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                            const SubChunks& sc, bool diagonal, GramGrads<S>& r, Mat<S>& rect) {
  const int64_t K = X.cols();
  Mat<S> T(kSubChunk, K);  // T.row(s - n_b) = M_rs X_r Y_s D_rs of the current r
  RowVec<S> D(K), yd(K), acc(K);
  for (int64_t b = 0; b < sc.n; ++b) {
    const int64_t nb = sc.first(b);
    for (int64_t rr = nb; rr < nb + sc.rows(b); ++rr) {
      if (diagonal) {
        r.dX.row(rr) += M(rr, rr) * Y.row(rr);
        r.dY.row(rr) += M(rr, rr) * X.row(rr);
      }
      D.setOnes();
      for (int64_t s = rr - 1; s >= nb; --s) {
        D.array() *= g.step.row(s + 1).array();
        yd = Y.row(s).cwiseProduct(D);
        r.dX.row(rr) += M(rr, s) * yd;
        r.dY.row(s) += M(rr, s) * X.row(rr).cwiseProduct(D);
        T.row(s - nb) = M(rr, s) * X.row(rr).cwiseProduct(yd);
      }
      acc.setZero();
      for (int64_t t = nb + 1; t <= rr; ++t) {  // rect_t += sum_{s < t} T_rs
        acc += T.row(t - 1 - nb);
        rect.row(t) += acc;
      }
    }
  }
}

template <class S>
GramGrads<S> gram_backward_channels(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                                    bool diagonal) {
  const int64_t L = X.rows(), K = X.cols();
  const SubChunks sc = sub_chunks(L);
  GramGrads<S> r{Mat<S>::Zero(L, K), Mat<S>::Zero(L, K), Mat<S>::Zero(L, K)};
  Mat<S> rowoff = Mat<S>::Zero(L, K), coloff = Mat<S>::Zero(L, K);
  std::vector<RowVec<S>> tot(size_t(sc.n * sc.n));
  gram_backward_blocks(M, X, Y, g, sc, r, rowoff, coloff, tot);
  gram_backward_diagonal(M, X, Y, g, sc, diagonal, r, r.da);
  RowVec<S> outer(K), acc(K);
  for (int64_t b = 0; b < sc.n; ++b) {
    const int64_t nb = sc.first(b), Lb = sc.rows(b);
    outer.setZero();  // whole blocks (i, j) with i > b > j
    for (int64_t i = b + 1; i < sc.n; ++i)
      for (int64_t j = 0; j < b; ++j) outer += tot[size_t(i * sc.n + j)];
    acc.setZero();
    for (int64_t t = nb + Lb - 1; t >= nb; --t) r.da.row(t) += (acc += rowoff.row(t)) + outer;
    acc.setZero();
    for (int64_t t = nb; t < nb + Lb; ++t) {
      r.da.row(t) += acc;
      acc += coloff.row(t);
    }
  }
  return r;
}

// Scalar gate: W = lower triangle of M weighted by D; T_rs = M_rs A_rs for s < r.
template <class S>
GramGrads<S> gram_backward_scalar(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                                  bool diagonal, const Mat<S>& A) {
  const int64_t L = X.rows();
  Mat<S> W = M.template triangularView<Eigen::StrictlyLower>().toDenseMatrix().cwiseProduct(g.decay);
  if (diagonal) W.diagonal() = M.diagonal();
  GramGrads<S> r;
  r.dX.noalias() = W.template triangularView<Eigen::Lower>() * Y;
  r.dY.noalias() = W.template triangularView<Eigen::Lower>().transpose() * X;
  r.da = Mat<S>::Zero(L, 1);
  for (int64_t rr = L - 1; rr >= 1; --rr) {  // da_t = sum_{r >= t} sum_{s < t} T_rs
    S acc = 0;
    for (int64_t t = 1; t <= rr; ++t) r.da(t, 0) += (acc += M(rr, t - 1) * A(rr, t - 1));
  }
  return r;
}

}  // namespace

template <class S>
Mat<S> gated_gram(const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g, bool diagonal) {
  if (g.B.cols() > 1) return gram_channels(X, Y, g, diagonal);
  Mat<S> A(X.rows(), Y.rows());  // only the lower triangle is formed; decay is zero above the diagonal
  if (diagonal) A.template triangularView<Eigen::Lower>() = X * Y.transpose();
  else A.template triangularView<Eigen::StrictlyLower>() = X * Y.transpose();
  if (diagonal) A.template triangularView<Eigen::StrictlyUpper>().setZero();
  else A.template triangularView<Eigen::Upper>().setZero();
  A.array() *= g.decay.array();
  return A;
}

template <class S>
GramGrads<S> gated_gram_backward(const Mat<S>& M, const Mat<S>& X, const Mat<S>& Y, const ChunkGate<S>& g,
                                 bool diagonal, const Mat<S>* A) {
  if (g.B.cols() > 1) return gram_backward_channels(M, X, Y, g, diagonal);
  return gram_backward_scalar(M, X, Y, g, diagonal, A ? *A : gated_gram(X, Y, g, diagonal));
}

#define KCP_INSTANTIATE(S)                                                                      \
  template Mat<S> gated_gram<S>(const Mat<S>&, const Mat<S>&, const ChunkGate<S>&, bool);       \
  template GramGrads<S> gated_gram_backward<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&,       \
                                               const ChunkGate<S>&, bool, const Mat<S>*);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
