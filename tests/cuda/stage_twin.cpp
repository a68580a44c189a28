// make_stage_twin(): runs chunkwise_forward_trace per (sequence, value head) and scatters every
// per-chunk matrix into the CUDA buffers' layouts (stage_twin.h). gla has no P and no w (they stay
// NaN: the CUDA pipeline writes neither for gla), beta_e = 0 and u = v. make_backward_twin(): the same
// with chunkwise_backward_trace.
#include "tests/cuda/stage_twin.h"

#include <cmath>
#include <limits>

#include "reference/chunkwise.h"
#include "tests/cuda/cuda_support.h"

namespace kcp::test {
namespace {

constexpr int64_t C = 64;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void put_row(Tensor<double>& t, int64_t row, const auto& src_row) {  // row of a [rows, D] buffer
  const int64_t D = src_row.size();
  for (int64_t d = 0; d < D; ++d) t.data()[row * D + d] = src_row(d);
}

// f(n, hv, seq, nt, chunk0) for every (sequence, value head): nt chunks from chunk0 of the CUDA table.
template <class F>
void for_each_head(const Problem& p, F&& f) {
  int64_t chunk0 = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    const kcp::SeqRange seq = p.sequence(n);
    const int64_t nt = ref::chunk_count(seq.len, C);
    for (int64_t hv = 0; hv < p.HV; ++hv) f(n, hv, seq, nt, chunk0);
    chunk0 += nt;
  }
}

}  // namespace

StageTwin make_stage_twin(const Problem& p, const Inputs& in) {
  const int64_t TT = p.B * p.T, Kg = p.per_channel_gate() ? p.K : 1, NT = cuda_chunk_count(p);
  StageTwin w;
  w.gcum = Tensor<double>({TT, p.HV, Kg}, kNaN), w.beta = Tensor<double>({TT, p.HV}, kNaN);
  w.rstd_q = Tensor<double>({TT, p.H}, kNaN), w.rstd_k = Tensor<double>({TT, p.H}, kNaN);
  w.P = Tensor<double>({NT, p.HV, C, C}, kNaN), w.Aqk = Tensor<double>({NT, p.HV, C, C}, kNaN);
  w.w = Tensor<double>({TT, p.HV, p.K}, kNaN), w.u = Tensor<double>({TT, p.HV, p.V}, kNaN);
  w.kg = Tensor<double>({TT, p.HV, p.K}, kNaN), w.qg = Tensor<double>({TT, p.HV, p.K}, kNaN);
  w.h = Tensor<double>({NT, p.HV, p.K, p.V}, kNaN), w.vnew = Tensor<double>({TT, p.HV, p.V}, kNaN);
  w.o = Tensor<double>({p.B, p.T, p.HV, p.V}, kNaN), w.ht = Tensor<double>({p.N, p.HV, p.K, p.V}, kNaN);
  for_each_head(p, [&](int64_t n, int64_t hv, const kcp::SeqRange& seq, int64_t nt, int64_t chunk0) {
    const ref::HeadData<double> d = ref::load_head<double>(p, in, n, hv);
    const ref::ChunkwiseTrace<double> t = ref::chunkwise_forward_trace(p, d);
    for (int64_t c = 0; c < nt; ++c) {
      const ref::ChunkLocal<double>& loc = t.chunk[size_t(c)];
      const int64_t len = loc.Aqk.rows(), ci = chunk0 + c;
      const bool delta = loc.P.size() > 0;  // gla: no P, no w
      for (int64_t r = 0; r < len; ++r) {
        const int64_t s_in = c * C + r, tt = seq.b * p.T + seq.t0 + s_in, row = tt * p.HV + hv;
        for (int64_t i = 0; i < Kg; ++i) w.gcum.data()[row * Kg + i] = loc.gate.B(r, i) / std::log(2.0);
        w.beta(tt, hv) = delta ? d.beta(s_in) : 0.0;  // gla: the cumsum stage writes beta_e = 0
        if (p.flags.use_qk_l2norm_in_kernel && hv % p.G() == 0)
          w.rstd_q(tt, hv / p.G()) = d.q_rstd(s_in), w.rstd_k(tt, hv / p.G()) = d.k_rstd(s_in);
        for (int64_t s = 0; s < len; ++s) {
          if (delta) w.P(ci, hv, r, s) = loc.P(r, s);
          w.Aqk(ci, hv, r, s) = loc.Aqk(r, s);
        }
        if (delta) put_row(w.w, row, loc.w.row(r));
        put_row(w.u, row, loc.u.row(r));
        if (p.per_channel_gate()) put_row(w.kg, row, loc.kg.row(r)), put_row(w.qg, row, loc.qg.row(r));
        put_row(w.vnew, row, t.vnew[size_t(c)].row(r)), put_row(w.o, row, t.o[size_t(c)].row(r));
      }
      for (int64_t i = 0; i < p.K; ++i)
        for (int64_t j = 0; j < p.V; ++j) w.h(ci, hv, i, j) = t.h[size_t(c)](i, j);
    }
    for (int64_t i = 0; i < p.K; ++i)
      for (int64_t j = 0; j < p.V; ++j) w.ht(n, hv, i, j) = t.ht(i, j);
  });
  return w;
}

BackwardTwin make_backward_twin(const Problem& p, const Inputs& in, const Cotangents& cot) {
  const int64_t TT = p.B * p.T, Kg = p.per_channel_gate() ? p.K : 1, NT = cuda_chunk_count(p);
  BackwardTwin w;
  w.dh = Tensor<double>({NT, p.HV, p.K, p.V}, kNaN), w.dvnew = Tensor<double>({TT, p.HV, p.V}, kNaN);
  w.dqv = Tensor<double>({TT, p.HV, p.K}, kNaN), w.dkv = Tensor<double>({TT, p.HV, p.K}, kNaN);
  w.dbeta = Tensor<double>({TT, p.HV}, kNaN), w.da = Tensor<double>({TT, p.HV, Kg}, kNaN);
  for_each_head(p, [&](int64_t n, int64_t hv, const kcp::SeqRange& seq, int64_t nt, int64_t chunk0) {
    const ref::HeadData<double> d = ref::load_head<double>(p, in, n, hv);
    const ref::HeadCotangents<double> hc = ref::load_head_cotangents(p, cot, d);
    const ref::ChunkwiseBackwardTrace<double> t = ref::chunkwise_backward_trace(p, d, hc.d_o, hc.dht);
    for (int64_t ci = 0; ci < nt; ++ci)
      for (int64_t i = 0; i < p.K; ++i)
        for (int64_t j = 0; j < p.V; ++j) w.dh(chunk0 + ci, hv, i, j) = t.dh[size_t(ci)](i, j);
    for (int64_t r = 0; r < seq.len; ++r) {
      const int64_t tt = seq.b * p.T + seq.t0 + r, ci = r / C, rr = r % C;
      for (int64_t j = 0; j < p.V; ++j) w.dvnew(tt, hv, j) = t.chunk[size_t(ci)].dvnew(rr, j);
      for (int64_t i = 0; i < p.K; ++i) w.dqv(tt, hv, i) = t.grads.dq(r, i), w.dkv(tt, hv, i) = t.grads.dk(r, i);
      for (int64_t i = 0; i < Kg; ++i) w.da(tt, hv, i) = t.grads.da(r, i);
      if (p.delta_rule()) w.dbeta(tt, hv) = t.grads.dbeta(r);
    }
  });
  return w;
}

}  // namespace kcp::test
