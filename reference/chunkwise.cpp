// Chunkwise forward: the stages gate cumsum, kkt, solve_tril, WY, state, output of one chunk, and
// the per-head forward that chains them over the chunk grid (formulas in chunkwise.h). The
// production forward keeps one chunk's pieces at a time; chunkwise_forward_trace keeps them all.
#include "reference/chunkwise.h"

#include <sstream>

#include "reference/chunkwise_intra.h"

namespace kcp::ref {

std::string chunkwise_chunk_size_error(int64_t C) {
  for (int64_t c : kChunkwiseChunkSizes)
    if (c == C) return {};
  std::ostringstream os;
  os << "chunk_size " << C << ": cpu-chunkwise supports";
  for (size_t i = 0; i < kChunkwiseChunkSizes.size(); ++i) os << (i ? ", " : " ") << kChunkwiseChunkSizes[i];
  return os.str();
}

void check_chunkwise_chunk_size(const Problem& p) {
  const std::string err = chunkwise_chunk_size_error(p.chunk_size);
  KCP_CHECK(err.empty(), err);
}

template <class S>
ChunkInputs<S> chunk_inputs(const HeadData<S>& d, ChunkSpan s) {
  ChunkInputs<S> x;
  x.q = d.q.middleRows(s.t0, s.len);
  x.k = d.k.middleRows(s.t0, s.len);
  x.v = d.v.middleRows(s.t0, s.len);
  x.a = d.a.middleRows(s.t0, s.len);
  if (d.beta.size()) x.beta = d.beta.segment(s.t0, s.len);
  return x;
}

template <class S>
ChunkGate<S> chunk_gate_cumsum(const Mat<S>& a) {
  const int64_t L = a.rows(), Kg = a.cols();
  KCP_CHECK(L >= 1, "chunk_gate_cumsum: a chunk has at least one row");
  Mat<double> B(L, Kg);  // float64 whatever S is (see chunkwise.h)
  B.row(0) = a.row(0).template cast<double>();
  for (int64_t r = 1; r < L; ++r) B.row(r) = B.row(r - 1) + a.row(r).template cast<double>();
  // exp in float64, then rounded to S (Eigen vectorizes exp only when no cast is fused into it)
  auto exp_s = [](const auto& x) { return Mat<S>(Mat<double>(x.array().exp()).template cast<S>()); };
  ChunkGate<S> g;
  g.B = B.template cast<S>();
  g.gamma = exp_s(B);
  g.gamma_end = g.gamma.row(L - 1);
  g.e = exp_s(-(B.rowwise() - B.row(L - 1)));  // exp(B_end - B_r) <= 1
  if (Kg == 1) {  // decay(r, s) = exp(B_r - B_s) for s <= r, row by row (vectorized float64 exp)
    const Eigen::Map<const Eigen::ArrayXd> b(B.data(), L);  // Kg = 1: the column is contiguous
    Mat<double> D = Mat<double>::Zero(L, L);
    for (int64_t r = 0; r < L; ++r) D.row(r).head(r + 1) = (b(r) - b.head(r + 1)).exp().matrix().transpose();
    g.decay = D.template cast<S>();
    return g;
  }
  const int64_t nsub = (L + kSubChunk - 1) / kSubChunk;
  g.sub_row.resize(L, Kg), g.sub_col.resize(L, Kg);
  for (int64_t r = 0; r < L; ++r) {
    const int64_t first = r / kSubChunk * kSubChunk, next = first + kSubChunk;
    g.sub_row.row(r) = exp_s(B.row(r) - B.row(first));
    if (next < L) g.sub_col.row(r) = exp_s(B.row(next) - B.row(r));
    else g.sub_col.row(r).setZero();
  }
  g.step = exp_s(a.template cast<double>());
  g.cross.resize(size_t(nsub * nsub));
  for (int64_t i = 1; i < nsub; ++i)
    for (int64_t j = 0; j < i; ++j)
      g.cross[size_t(i * nsub + j)] = exp_s(B.row(i * kSubChunk) - B.row((j + 1) * kSubChunk));
  return g;
}

template <class S>
Mat<S> chunk_kkt(const Mat<S>& k, const Vec<S>& beta, const ChunkGate<S>& g) {
  Mat<S> A = gated_gram(k, k, g, false);
  A.array().colwise() *= beta.array();  // row r times beta_r, in place
  return A;
}

template <class S>
Mat<S> chunk_aqk(const Mat<S>& q, const Mat<S>& k, const ChunkGate<S>& g, S scale) {
  Mat<S> A = gated_gram(q, k, g, true);
  A *= scale;
  return A;
}

template <class S>
Mat<S> chunk_solve_tril(const Mat<S>& Lmat) {
  Mat<S> P = Mat<S>::Identity(Lmat.rows(), Lmat.cols());
  Lmat.template triangularView<Eigen::UnitLower>().solveInPlace(P);  // reads the strict lower part only
  return P;
}

template <class S>
void chunk_wy(const ChunkInputs<S>& x, ChunkLocal<S>& loc) {
  const ChunkGate<S>& g = loc.gate;
  loc.kg = gate_mul(x.k, g.e);
  loc.qg = gate_mul(x.q, g.gamma);
  if (x.beta.size() == 0) {  // gla: no WY, the values enter as they are
    loc.u = x.v;
    loc.w.resize(0, 0);
    return;
  }
  const int64_t L = x.k.rows(), K = x.k.cols(), V = x.v.cols();
  Mat<S> rhs(L, K + V);  // [beta k Gamma | beta v], one triangular product for both
  if (g.gamma.cols() == 1) {  // scalar gate: row r of k scaled by beta_r Gamma_r in one pass
    const Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>> gamma(g.gamma.data(), L);
    rhs.leftCols(K) = x.k.array().colwise() * (x.beta.array() * gamma);
  } else {
    rhs.leftCols(K) = (x.k.array() * g.gamma.array()).colwise() * x.beta.array();
  }
  rhs.rightCols(V) = x.v.array().colwise() * x.beta.array();
  const Mat<S> wu = loc.P.template triangularView<Eigen::UnitLower>() * rhs;
  loc.w = wu.leftCols(K);
  loc.u = wu.rightCols(V);
}

template <class S>
ChunkLocal<S> chunk_local_forward(const Problem& p, const ChunkInputs<S>& x) {
  ChunkLocal<S> loc;
  loc.gate = chunk_gate_cumsum(x.a);
  if (p.delta_rule()) {
    loc.Lmat = chunk_kkt(x.k, x.beta, loc.gate);
    loc.P = chunk_solve_tril(loc.Lmat);
  }
  loc.Aqk = chunk_aqk(x.q, x.k, loc.gate, S(p.scale));
  chunk_wy(x, loc);
  return loc;
}

template <class S>
void chunk_state(const ChunkLocal<S>& loc, const Mat<S>& h, Mat<S>& vnew, Mat<S>& h_next) {
  vnew = loc.u;
  if (loc.w.size()) vnew.noalias() -= loc.w * h;
  const RowVec<S>& ge = loc.gate.gamma_end;
  if (ge.size() == 1) h_next = ge(0) * h;
  else h_next = ge.transpose().asDiagonal() * h;
  h_next.noalias() += loc.kg.transpose() * vnew;
}

template <class S>
void chunk_state_output(const ChunkLocal<S>& loc, const Mat<S>& h, S scale, Mat<S>& vnew, Mat<S>& h_next,
                        Eigen::Ref<Mat<S>> o, Mat<S>& work) {
  const int64_t L = loc.u.rows();
  if (loc.w.size()) {
    work.resize(2 * L, h.rows());  // [w; qg]: one product reads h once for both
    work.topRows(L) = loc.w;
    work.bottomRows(L) = loc.qg;
    const Mat<S> wq_h = work * h;
    vnew = loc.u - wq_h.topRows(L);
    o = scale * wq_h.bottomRows(L);
  } else {
    vnew = loc.u;
    o.noalias() = loc.qg * h;
    o *= scale;
  }
  o.noalias() += loc.Aqk.template triangularView<Eigen::Lower>() * vnew;
  const RowVec<S>& ge = loc.gate.gamma_end;
  if (ge.size() == 1) h_next = ge(0) * h;
  else h_next = ge.transpose().asDiagonal() * h;
  h_next.noalias() += loc.kg.transpose() * vnew;
}

template <class S>
Mat<S> chunk_output(const ChunkLocal<S>& loc, const Mat<S>& h, const Mat<S>& vnew, S scale) {
  Mat<S> o = loc.qg * h;
  o *= scale;
  o.noalias() += loc.Aqk.template triangularView<Eigen::Lower>() * vnew;
  return o;
}

template <class S>
Mat<S> chunk_transition_matrix(const ChunkLocal<S>& loc) {
  const RowVec<S>& ge = loc.gate.gamma_end;
  const int64_t K = loc.kg.cols();
  Mat<S> M = ge.size() == 1 ? Mat<S>(ge(0) * Mat<S>::Identity(K, K)) : Mat<S>(ge.transpose().asDiagonal());
  if (loc.w.size()) M.noalias() -= loc.kg.transpose() * loc.w;
  return M;
}

template <class S>
ChunkwiseTrace<S> chunkwise_forward_trace(const Problem& p, const HeadData<S>& d) {
  check_chunkwise_chunk_size(p);
  const int64_t L = d.seq.len, C = p.chunk_size, NT = chunk_count(L, C);
  ChunkwiseTrace<S> t;
  t.ht = d.h0;
  Mat<S> h_next, work;
  for (int64_t c = 0; c < NT; ++c) {  // the per-head forward's code path, keeping every piece
    const ChunkSpan s = chunk_span(L, C, c);
    t.chunk.push_back(chunk_local_forward(p, chunk_inputs(d, s)));
    t.h.push_back(t.ht);
    t.vnew.emplace_back();
    t.o.emplace_back(s.len, p.V);
    chunk_state_output<S>(t.chunk.back(), t.h.back(), S(p.scale), t.vnew.back(), h_next, t.o.back(), work);
    t.ht.swap(h_next);
  }
  return t;
}

template <class S>
void chunkwise_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht) {
  check_chunkwise_chunk_size(p);
  const int64_t L = d.seq.len, C = p.chunk_size, NT = chunk_count(L, C);
  o.resize(L, p.V);
  ht = d.h0;
  Mat<S> vnew, h_next, work;
  for (int64_t c = 0; c < NT; ++c) {
    const ChunkSpan s = chunk_span(L, C, c);
    const ChunkLocal<S> loc = chunk_local_forward(p, chunk_inputs(d, s));
    chunk_state_output<S>(loc, ht, S(p.scale), vnew, h_next, o.middleRows(s.t0, s.len), work);
    ht.swap(h_next);
  }
}

#define KCP_INSTANTIATE(S)                                                                               \
  template ChunkInputs<S> chunk_inputs<S>(const HeadData<S>&, ChunkSpan);                                \
  template ChunkGate<S> chunk_gate_cumsum<S>(const Mat<S>&);                                             \
  template Mat<S> chunk_kkt<S>(const Mat<S>&, const Vec<S>&, const ChunkGate<S>&);                       \
  template Mat<S> chunk_aqk<S>(const Mat<S>&, const Mat<S>&, const ChunkGate<S>&, S);                    \
  template Mat<S> chunk_solve_tril<S>(const Mat<S>&);                                                    \
  template void chunk_wy<S>(const ChunkInputs<S>&, ChunkLocal<S>&);                                      \
  template ChunkLocal<S> chunk_local_forward<S>(const Problem&, const ChunkInputs<S>&);                  \
  template void chunk_state<S>(const ChunkLocal<S>&, const Mat<S>&, Mat<S>&, Mat<S>&);                   \
  template Mat<S> chunk_output<S>(const ChunkLocal<S>&, const Mat<S>&, const Mat<S>&, S);                \
  template void chunk_state_output<S>(const ChunkLocal<S>&, const Mat<S>&, S, Mat<S>&, Mat<S>&,          \
                                      Eigen::Ref<Mat<S>>, Mat<S>&);                                      \
  template Mat<S> chunk_transition_matrix<S>(const ChunkLocal<S>&);                                      \
  template ChunkwiseTrace<S> chunkwise_forward_trace<S>(const Problem&, const HeadData<S>&);             \
  template void chunkwise_forward_head<S>(const Problem&, const HeadData<S>&, Mat<S>&, Mat<S>&);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
