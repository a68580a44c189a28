// Chunkwise backward: the stages dAv, dhu (state backward), inter (dqkwg), WY backward, intra and
// the reverse gate cumsum of one chunk, and the per-head backward (formulas in chunkwise.h).
// The head backward first recomputes the forward, keeping each chunk's state-independent pieces
// and the states h[c] entering the chunks (memory ~ L (K+V+C) + NT K V, never L K V), then walks
// the chunks last to first carrying dh, the gradient of the state leaving the current chunk.
#include "reference/chunkwise.h"

#include "reference/chunkwise_intra.h"

namespace kcp::ref {

template <class S>
ChunkDAv<S> chunk_bwd_dAv(const ChunkLocal<S>& loc, const Mat<S>& vnew, const Mat<S>& d_o, S scale) {
  const int64_t L = d_o.rows();
  ChunkDAv<S> r;
  r.dAqk = Mat<S>::Zero(L, L);
  r.dAqk.template triangularView<Eigen::Lower>() = (scale * d_o) * vnew.transpose();
  r.dv_loc.noalias() = loc.Aqk.template triangularView<Eigen::Lower>().transpose() * d_o;
  return r;
}

template <class S>
void chunk_state_backward(const ChunkLocal<S>& loc, const Mat<S>& dv_loc, const Mat<S>& d_o, const Mat<S>& dh,
                          S scale, Mat<S>& dvnew, Mat<S>& dh_in) {
  dvnew = dv_loc;
  dvnew.noalias() += loc.kg * dh;
  const RowVec<S>& ge = loc.gate.gamma_end;
  if (ge.size() == 1) dh_in = ge(0) * dh;
  else dh_in = ge.transpose().asDiagonal() * dh;
  if (loc.w.size() == 0) {
    dh_in.noalias() += loc.qg.transpose() * (scale * d_o);
    return;
  }
  // qg^T (scale do) - w^T dvnew as one product [qg; w]^T [scale do; -dvnew] (depth 2 len)
  const int64_t L = d_o.rows();
  Mat<S> a(2 * L, loc.qg.cols()), b(2 * L, d_o.cols());
  a.topRows(L) = loc.qg, a.bottomRows(L) = loc.w;
  b.topRows(L) = scale * d_o, b.bottomRows(L) = -dvnew;
  dh_in.noalias() += a.transpose() * b;
}

template <class S>
ChunkHtProducts<S> chunk_bwd_ht_products(const ChunkLocal<S>& loc, const Mat<S>& h, const Mat<S>& d_o,
                                         const Mat<S>& dvnew, S scale) {
  ChunkHtProducts<S> r;
  const int64_t L = d_o.rows();
  if (loc.w.size() == 0) {  // gla: no WY backward
    r.do_hT.noalias() = (scale * d_o) * h.transpose();
    return r;
  }
  r.dXu.noalias() = loc.P.template triangularView<Eigen::UnitLower>().transpose() * dvnew;
  Mat<S> a(2 * L, d_o.cols());  // [scale do; dXu] h^T: one read of h for both
  a.topRows(L) = scale * d_o, a.bottomRows(L) = r.dXu;
  const Mat<S> prod = a * h.transpose();
  r.do_hT = prod.topRows(L);
  r.dXw = -prod.bottomRows(L);
  return r;
}

template <class S>
ChunkInterGrads<S> chunk_inter_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& h,
                                        const Mat<S>& vnew, const Mat<S>& do_hT, const Mat<S>& dh) {
  const ChunkGate<S>& g = loc.gate;
  const int64_t Kg = g.B.cols();
  ChunkInterGrads<S> r;
  r.dq_inter = gate_mul(do_hT, g.gamma);
  r.dk_inter.noalias() = vnew * dh.transpose();
  r.dk_inter = gate_mul(r.dk_inter, g.e);
  r.dB_q = gate_reduce(Mat<S>(x.q.cwiseProduct(r.dq_inter)), Kg);
  r.dB_kg = gate_reduce(Mat<S>(x.k.cwiseProduct(r.dk_inter)), Kg);
  const RowVec<S> hdh = h.cwiseProduct(dh).rowwise().sum().transpose();
  r.dB_all = gate_reduce(Mat<S>(gate_mul(Mat<S>(hdh), Mat<S>(g.gamma_end))), Kg);
  return r;
}

template <class S>
Mat<S> fla_dB_inter(const ChunkInterGrads<S>& in) {
  Mat<S> dB = in.dB_q - in.dB_kg;
  dB.row(dB.rows() - 1) += in.dB_all + in.dB_kg.colwise().sum();
  return dB;
}

template <class S>
Mat<S> chunk_dw(const Mat<S>& dvnew, const Mat<S>& h) {
  return -(dvnew * h.transpose());
}

template <class S>
ChunkWYGrads<S> chunk_wy_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& vnew,
                                  const Mat<S>& dvnew, ChunkHtProducts<S>&& hp) {
  ChunkWYGrads<S> r;
  if (loc.w.size() == 0) {  // gla: vnew = v
    r.dv = dvnew;
    return r;
  }
  const ChunkGate<S>& g = loc.gate;
  const int64_t L = dvnew.rows();
  const auto Pt = loc.P.template triangularView<Eigen::UnitLower>().transpose();
  r.dXu = std::move(hp.dXu);
  r.dXw = std::move(hp.dXw);
  const Mat<S> kG = gate_mul(x.k, g.gamma);
  r.dv = x.beta.asDiagonal() * r.dXu;
  r.dbeta_wy = x.v.cwiseProduct(r.dXu).rowwise().sum() + kG.cwiseProduct(r.dXw).rowwise().sum();
  r.dk_wy = x.beta.asDiagonal() * gate_mul(r.dXw, g.gamma);
  r.dB_wy = gate_reduce(Mat<S>(x.beta.asDiagonal() * kG.cwiseProduct(r.dXw)), g.B.cols());
  Mat<S> rhs = vnew;  // (I + Lmat) vnew = beta v - beta k Gamma h
  rhs.noalias() += loc.Lmat.template triangularView<Eigen::StrictlyLower>() * vnew;
  r.dP = Mat<S>::Zero(L, L);
  r.dP.template triangularView<Eigen::StrictlyLower>() = dvnew * rhs.transpose();
  const Mat<S> T = Pt * r.dP;  // upper times strictly lower
  r.dL = Mat<S>::Zero(L, L);
  r.dL.template triangularView<Eigen::StrictlyLower>() = -(T * Pt);
  return r;
}

template <class S>
ChunkIntraGrads<S> chunk_intra_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& dAqk,
                                        const Mat<S>& dL, S scale) {
  const ChunkGate<S>& g = loc.gate;
  const int64_t Kg = g.B.cols();
  const bool scalar = Kg == 1;  // the scalar-gate backward reuses the forward's grams
  ChunkIntraGrads<S> r;
  // Aqk = scale gram(q, k) and dAqk carries the scale: dAqk is the gradient w.r.t. gram(q, k)
  const Mat<S> gram_qk = scalar ? Mat<S>(loc.Aqk / scale) : Mat<S>();
  GramGrads<S> ga = gated_gram_backward(dAqk, x.q, x.k, g, true, scalar ? &gram_qk : nullptr);
  Mat<S> dB = x.q.cwiseProduct(ga.dX) - x.k.cwiseProduct(ga.dY);
  r.dq_intra = std::move(ga.dX);
  r.dk_intra = std::move(ga.dY);
  r.da_intra = std::move(ga.da);
  if (dL.size()) {  // Lmat = gram(beta k, k)
    const Mat<S> bk = x.beta.asDiagonal() * x.k;
    const GramGrads<S> gl = gated_gram_backward(dL, bk, x.k, g, false, scalar ? &loc.Lmat : nullptr);  // dkrow, dkcol
    r.dbeta_intra = x.k.cwiseProduct(gl.dX).rowwise().sum();
    r.dk_intra += x.beta.asDiagonal() * gl.dX + gl.dY;
    r.da_intra += gl.da;
    dB += bk.cwiseProduct(gl.dX) - x.k.cwiseProduct(gl.dY);
  }
  r.dB_intra = gate_reduce(dB, Kg);
  return r;
}

template <class S>
Mat<S> chunk_gate_cumsum_backward(const Mat<S>& dB_rev, const Mat<S>& dB_kg, const RowVec<S>& dB_all) {
  const int64_t L = dB_rev.rows();
  Mat<S> da(L, dB_rev.cols());
  RowVec<S> acc = dB_rev.row(L - 1);
  da.row(L - 1) = acc;
  for (int64_t r = L - 2; r >= 0; --r) da.row(r) = acc += dB_rev.row(r);  // suffix sums
  acc = dB_all;
  for (int64_t r = 0; r < L; ++r) {  // exclusive prefix sums of the kg piece
    da.row(r) += acc;
    acc += dB_kg.row(r);
  }
  return da;
}

namespace {

// All backward stages of one chunk; dh is the gradient of the state leaving it, dh_in (in `b`)
// the gradient of the state entering it. Assembles the chunk's rows of the head gradients.
template <class S>
void backward_chunk(const Problem& p, const HeadData<S>& d, ChunkSpan s, const ChunkLocal<S>& loc, const Mat<S>& h,
                    const Mat<S>& vnew, const Mat<S>& d_o, const Mat<S>& dh, ChunkBackward<S>& b, HeadGrads<S>& g) {
  const S scale = S(p.scale);
  const ChunkInputs<S> x = chunk_inputs(d, s);
  const Mat<S> do_c = d_o.middleRows(s.t0, s.len);
  ChunkDAv<S> dav = chunk_bwd_dAv(loc, vnew, do_c, scale);
  b.dAqk = std::move(dav.dAqk), b.dv_loc = std::move(dav.dv_loc);
  chunk_state_backward(loc, b.dv_loc, do_c, dh, scale, b.dvnew, b.dh_in);
  ChunkHtProducts<S> hp = chunk_bwd_ht_products(loc, h, do_c, b.dvnew, scale);
  ChunkInterGrads<S> in = chunk_inter_backward(x, loc, h, vnew, hp.do_hT, dh);
  ChunkWYGrads<S> wy = chunk_wy_backward(x, loc, vnew, b.dvnew, std::move(hp));
  ChunkIntraGrads<S> ia = chunk_intra_backward(x, loc, b.dAqk, wy.dL, scale);
  g.dq.middleRows(s.t0, s.len) = in.dq_inter + ia.dq_intra;
  Mat<S> dk = in.dk_inter + ia.dk_intra;
  Mat<S> dB = in.dB_q;
  if (p.delta_rule()) {
    dk += wy.dk_wy;
    dB += wy.dB_wy;
    g.dbeta.segment(s.t0, s.len) = wy.dbeta_wy + ia.dbeta_intra;
  }
  g.dk.middleRows(s.t0, s.len) = dk;
  g.dv.middleRows(s.t0, s.len) = wy.dv;
  g.da.middleRows(s.t0, s.len) = chunk_gate_cumsum_backward(dB, in.dB_kg, in.dB_all) + ia.da_intra;
  b.dq_inter = std::move(in.dq_inter), b.dk_inter = std::move(in.dk_inter);
  b.dB_q = std::move(in.dB_q), b.dB_kg = std::move(in.dB_kg), b.dB_all = std::move(in.dB_all);
  b.dXu = std::move(wy.dXu), b.dXw = std::move(wy.dXw);
  b.dv = std::move(wy.dv), b.dk_wy = std::move(wy.dk_wy), b.dB_wy = std::move(wy.dB_wy);
  b.dP = std::move(wy.dP), b.dL = std::move(wy.dL), b.dbeta_wy = std::move(wy.dbeta_wy);
  b.dq_intra = std::move(ia.dq_intra), b.dk_intra = std::move(ia.dk_intra), b.dB_intra = std::move(ia.dB_intra);
  b.da_intra = std::move(ia.da_intra);
  b.dbeta_intra = std::move(ia.dbeta_intra);
}

// Runs the backward; keeps every chunk's pieces in `trace` when given.
template <class S>
void backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht, HeadGrads<S>& g,
                   ChunkwiseBackwardTrace<S>* trace) {
  check_chunkwise_chunk_size(p);
  const int64_t L = d.seq.len, C = p.chunk_size, NT = chunk_count(L, C);
  g.dq.resize(L, p.K);  // every row is written by its chunk below
  g.dk.resize(L, p.K);
  g.dv.resize(L, p.V);
  g.da.resize(L, d.a.cols());
  g.dbeta.resize(p.delta_rule() ? L : 0);
  // recompute the forward: local pieces, entering states, vnew
  std::vector<ChunkLocal<S>> loc(static_cast<size_t>(NT));
  std::vector<Mat<S>> h(static_cast<size_t>(NT)), vnew(static_cast<size_t>(NT));
  Mat<S> X = d.h0, X_next;
  for (int64_t c = 0; c < NT; ++c) {
    const size_t ci = size_t(c);
    loc[ci] = chunk_local_forward(p, chunk_inputs(d, chunk_span(L, C, c)));
    h[ci] = X;
    chunk_state(loc[ci], X, vnew[ci], X_next);
    X.swap(X_next);
  }
  if (trace) trace->dh.resize(size_t(NT)), trace->chunk.resize(size_t(NT));
  Mat<S> dS = dht;
  ChunkBackward<S> b;
  for (int64_t c = NT - 1; c >= 0; --c) {
    const size_t ci = size_t(c);
    ChunkBackward<S>& bc = trace ? trace->chunk[ci] : b;
    if (trace) trace->dh[ci] = dS;
    backward_chunk(p, d, chunk_span(L, C, c), loc[ci], h[ci], vnew[ci], d_o, dS, bc, g);
    if (trace && p.delta_rule()) bc.dw = chunk_dw(bc.dvnew, h[ci]);
    dS = bc.dh_in;
    loc[ci] = ChunkLocal<S>();  // release as we go
  }
  g.dh0 = dS;
}

}  // namespace

template <class S>
ChunkwiseBackwardTrace<S> chunkwise_backward_trace(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                                   const Mat<S>& dht) {
  ChunkwiseBackwardTrace<S> t;
  backward_head(p, d, d_o, dht, t.grads, &t);
  return t;
}

template <class S>
void chunkwise_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht,
                             HeadGrads<S>& g) {
  backward_head<S>(p, d, d_o, dht, g, nullptr);
}

#define KCP_INSTANTIATE(S)                                                                                     \
  template ChunkDAv<S> chunk_bwd_dAv<S>(const ChunkLocal<S>&, const Mat<S>&, const Mat<S>&, S);                \
  template void chunk_state_backward<S>(const ChunkLocal<S>&, const Mat<S>&, const Mat<S>&, const Mat<S>&, S,  \
                                        Mat<S>&, Mat<S>&);                                                     \
  template ChunkHtProducts<S> chunk_bwd_ht_products<S>(const ChunkLocal<S>&, const Mat<S>&, const Mat<S>&,    \
                                                       const Mat<S>&, S);                                      \
  template ChunkInterGrads<S> chunk_inter_backward<S>(const ChunkInputs<S>&, const ChunkLocal<S>&,             \
                                                      const Mat<S>&, const Mat<S>&, const Mat<S>&,             \
                                                      const Mat<S>&);                                          \
  template Mat<S> chunk_dw<S>(const Mat<S>&, const Mat<S>&);                                                   \
  template ChunkWYGrads<S> chunk_wy_backward<S>(const ChunkInputs<S>&, const ChunkLocal<S>&, const Mat<S>&,    \
                                                const Mat<S>&, ChunkHtProducts<S>&&);                          \
  template ChunkIntraGrads<S> chunk_intra_backward<S>(const ChunkInputs<S>&, const ChunkLocal<S>&,             \
                                                      const Mat<S>&, const Mat<S>&, S);                        \
  template Mat<S> fla_dB_inter<S>(const ChunkInterGrads<S>&);                                                 \
  template Mat<S> chunk_gate_cumsum_backward<S>(const Mat<S>&, const Mat<S>&, const RowVec<S>&);              \
  template ChunkwiseBackwardTrace<S> chunkwise_backward_trace<S>(const Problem&, const HeadData<S>&,            \
                                                                 const Mat<S>&, const Mat<S>&);                \
  template void chunkwise_backward_head<S>(const Problem&, const HeadData<S>&, const Mat<S>&, const Mat<S>&,   \
                                           HeadGrads<S>&);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
