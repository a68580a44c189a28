// Parallel drivers shared by the CPU algorithms: run a per-head "core" (recurrent.h, chunkwise.h)
// over every (sequence, value head) with OpenMP, then reduce what several heads share (dq/dk over
// a GVA group, dA_log/ddt_bias over sequences) in a fixed order. Every output element is written
// by one task and every sum has a fixed order, so results are bitwise identical for any thread
// count. A Core provides forward / backward / transition_forward / transition_backward on HeadData.
// Covered by tests/reference/test_recurrent.cpp ("thread count does not change a bit").
#pragma once

#include <exception>
#include <mutex>
#include <utility>

#include "core/backend.h"
#include "reference/head_io.h"

namespace kcp::ref {

// Runs body(task) for task in [0, n) in parallel; the first exception is rethrown afterwards
// (exceptions must not cross an OpenMP region).
template <class F>
void parallel_tasks(int64_t n, F&& body) {
  std::exception_ptr err;
  std::mutex mu;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < n; ++task) {
    try {
      body(task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

template <class S, class Core>
void drive_forward(const Core& core, const Problem& p, const Inputs& in, const Outputs& out) {
  check_outputs(p, out);
  parallel_tasks(p.N * p.HV, [&](int64_t task) {
    const int64_t n = task / p.HV, hv = task % p.HV;
    const HeadData<S> d = load_head<S>(p, in, n, hv);
    Mat<S> o, ht;
    core.forward(p, d, o, ht);
    store_rows(out.o, d.seq, hv, o);
    if (!out.final_state.empty()) store_state(out.final_state, n, hv, ht, p.flags.state_v_first);
  });
}

// Sums a per-value-head gradient [B,T,HV,K] over each GVA group into [B,T,H,K], in group order.
template <class S>
void reduce_gva(const Problem& p, const Tensor<S>& per_hv, const TensorView& out) {
  const int64_t G = p.G();
  parallel_tasks(p.B * p.T, [&](int64_t bt) {
    const SeqRange row{bt / p.T, bt % p.T, 1};
    for (int64_t h = 0; h < p.H; ++h) {
      Mat<S> acc = Mat<S>::Zero(1, p.K);
      for (int64_t gi = 0; gi < G; ++gi)
        acc += Eigen::Map<const RowVec<S>>(per_hv.data() + (bt * p.HV + h * G + gi) * p.K, p.K);
      store_rows(out, row, h, acc);
    }
  });
}

template <class S, class Core>
void drive_backward(const Core& core, const Problem& p, const Inputs& in, const Cotangents& dc, const Grads& gr) {
  check_cotangents(p, dc);
  check_grads(p, in, gr);
  const int64_t G = p.G(), Kg = gate_width(p);
  const bool gva = G > 1;
  Tensor<S> dq_hv(gva && !gr.dq.empty() ? Shape{p.B, p.T, p.HV, p.K} : Shape{});
  Tensor<S> dk_hv(gva && !gr.dk.empty() ? Shape{p.B, p.T, p.HV, p.K} : Shape{});
  Tensor<S> dA_part({p.N, p.HV}), ddt_part({p.N, p.HV, Kg});
  parallel_tasks(p.N * p.HV, [&](int64_t task) {
    const int64_t n = task / p.HV, hv = task % p.HV;
    const HeadData<S> d = load_head<S>(p, in, n, hv);
    const HeadCotangents<S> ct = load_head_cotangents(p, dc, d);
    HeadGrads<S> hg;
    core.backward(p, d, ct.d_o, ct.dht, hg);
    const HeadInputGrads<S> ig = chain_to_inputs(p, d, std::move(hg));
    if (!gr.dv.empty()) store_rows(gr.dv, d.seq, hv, ig.dv);
    if (!gr.dg.empty()) {
      if (p.per_channel_gate()) store_rows(gr.dg, d.seq, hv, ig.dg);
      else store_scalars(gr.dg, d.seq, hv, Vec<S>(ig.dg.col(0)));
    }
    if (!gr.dbeta.empty()) store_scalars(gr.dbeta, d.seq, hv, ig.dbeta);
    if (!gr.d_initial_state.empty()) store_state(gr.d_initial_state, n, hv, ig.dh0, p.flags.state_v_first);
    if (!gr.dq.empty()) store_rows(gva ? dq_hv.view() : gr.dq, d.seq, gva ? hv : d.h, ig.dq);
    if (!gr.dk.empty()) store_rows(gva ? dk_hv.view() : gr.dk, d.seq, gva ? hv : d.h, ig.dk);
    dA_part(n, hv) = ig.dA_log;
    for (int64_t i = 0; i < Kg; ++i) ddt_part(n, hv, i) = ig.ddt_bias(i);
  });
  if (gva && !gr.dq.empty()) reduce_gva(p, dq_hv, gr.dq);
  if (gva && !gr.dk.empty()) reduce_gva(p, dk_hv, gr.dk);
  for (int64_t hv = 0; hv < p.HV; ++hv) {  // parameters shared by all sequences: sum in order of n
    S dA = 0;
    Vec<S> ddt = Vec<S>::Zero(Kg);
    for (int64_t n = 0; n < p.N; ++n) {
      dA += dA_part(n, hv);
      for (int64_t i = 0; i < Kg; ++i) ddt(i) += ddt_part(n, hv, i);
    }
    if (!gr.dA_log.empty()) gr.dA_log.set(hv * gr.dA_log.stride[0], double(dA));
    if (!gr.ddt_bias.empty()) view_store<S>(gr.ddt_bias, hv * Kg * gr.ddt_bias.stride[0], Kg, gr.ddt_bias.stride[0], ddt.data());
  }
}

// One sequence's transition as two views: s_ext [HV,K,V], m [HV,K,K] (strided parts of a packed element;
// m may be empty in a backward call that asks for dS_ext alone: M^T is then computed and dropped).
struct Transition {
  TensorView s_ext, m;
};
void check_transition(const Problem& p, int64_t seq, const Transition& tr);
// [HV,K,X] view <-> K x X matrix of head hv
template <class S> void store_head_matrix(const TensorView& t, int64_t hv, const Mat<S>& m);

template <class S, class Core>
void drive_transition_forward(const Core& core, const Problem& p, const Inputs& in, int64_t seq, const Transition& tr) {
  check_transition(p, seq, tr);
  parallel_tasks(p.HV, [&](int64_t hv) {
    const HeadData<S> d = load_head<S>(p, in, seq, hv);
    Mat<S> s_ext, m;
    core.transition_forward(p, d, s_ext, m);
    store_head_matrix(tr.s_ext, hv, s_ext);
    store_head_matrix(tr.m, hv, m);
  });
}

template <class S, class Core>
void drive_transition_backward(const Core& core, const Problem& p, const Inputs& in, const TensorView& d_o,
                               int64_t seq, const Transition& tr) {
  check_transition(p, seq, tr);
  KCP_CHECK(d_o.shape == shape_v(p), "do: expected shape [B,T,HV,V] = ", shape_str(shape_v(p)), ", got ",
            shape_str(d_o.shape));
  parallel_tasks(p.HV, [&](int64_t hv) {
    const HeadData<S> d = load_head<S>(p, in, seq, hv);
    const Mat<S> dot = load_rows<S>(d_o, d.seq, hv, p.V);
    Mat<S> ds_ext, m_t;
    core.transition_backward(p, d, dot, ds_ext, m_t);
    store_head_matrix(tr.s_ext, hv, ds_ext);
    if (!tr.m.empty()) store_head_matrix(tr.m, hv, m_t);
  });
}

}  // namespace kcp::ref
