// Pipeline::backward and Pipeline::transition_backward: the forward's stages run again (unless a kept
// forward left them, chunkwise_keep.cu) with h and vnew kept (cumsum -> kkt + solve -> WY -> state: the forward's state kernel, folded for gdn with
// 16-bit inputs, which writes vnew = P Y = u - w S; WY still runs, dhu reads w; gla: kkt -> Aqk, kg,
// qg, no WY, the state from v), then the backward
// kernels of chunk_bwd.cuh: dhu -> chunk -> finish.
// Backward workspace, float32: dh NT*HV*K*V; dvnew TT*HV*V; dqv, dkv 2*TT*HV*K;
// dbeta_e TT*HV; da, dx, dalog 3*TT*HV*Kg; the chunk stage's dAc, Wc 2*NT*HV*64*64 and partial sums
// TT*HV*8 (on top of the forward's stage buffers with h and vnew).
// Covered by tests/cuda/test_cuda_backward.cpp.
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunkwise_impl.cuh"
#include "cuda/device_guard.cuh"
#include "cuda/stage_timer.cuh"
#include "core/transition.h"

namespace kcp::cuda {
namespace {

OutRowsView out_rows(const TensorView& t, const char* name) {
  if (t.empty()) return {};
  return rows_view<OutRowsView>(t, name);
}

OutScalarView out_scalar(const TensorView& t, const char* name) {
  OutScalarView s;
  if (t.empty()) return s;
  expect_device(t, name);
  s.p = t.data, s.s = t.stride[0], s.dt = dtype_code(t, name);
  return s;
}

}  // namespace

// The forward buffer a backward buffer may live in: dead (no later reader) before the backward
// buffer's first write, as large (kg^T's slot may be larger than dkv) and present in this call; else
// null (own memory). In stream order: front (cumsum, kkt: P, Aqk; WY: w, u, kg or kg^T, qg) -> state
// recompute (reads w, u, kg or kg^T, qg) ->
// dhu_local (reads Aqk; first writes dkv, dvnew) -> dhu (reads w; with dhu_forms_local Aqk, and
// dhu_local does not run) -> hv (first writes dqv, dAc) -> wy -> intra -> finish. No backward kernel
// reads u, kg, qg; only dhu_local or dhu reads Aqk and only dhu reads w. So: dvnew in u, dAc in Aqk; kda and gla: dkv in kg (or kg^T), dqv in qg; gdn: dqv in w.
// Their contents are per call (every stage rewrites them), so sharing changes no result.
const TensorView* Pipeline::Impl::backward_alias(const TensorView* b) const {
  const BackwardBuffers& bb = bbuf;
  const TensorView* f = nullptr;
  if (b == &bb.dvnew) f = &buf.u;
  if (b == &bb.dAc) f = &buf.Aqk;
  if (b == &bb.dkv) f = buf.kg.empty() ? &buf.kgt : &buf.kg;  // one slot (size_workspace), dead after the chain
  if (b == &bb.dqv) f = buf.qg.empty() ? &buf.w : &buf.qg;
  return f && !f->empty() && f->numel() >= b->numel() ? f : nullptr;  // kg^T's slot may be the larger
}

// Carves the backward workspace (growing it when needed) into bbuf; some buffers live in dead
// forward buffers (backward_alias).
void Pipeline::Impl::size_backward_workspace(const Problem& p) {
  Impl& im = *this;
  const int64_t TT = p.B * p.T, NT = im.NT, Kg = p.per_channel_gate() ? p.K : 1;
  BackwardBuffers& b = im.bbuf;
  const std::pair<TensorView*, Shape> items[] = {
      {&b.dh, {NT, p.HV, p.K, p.V}},
      {&b.dvnew, {TT, p.HV, p.V}},     {&b.dqv, {TT, p.HV, p.K}},   {&b.dkv, {TT, p.HV, p.K}},
      {&b.dbeta_e, {TT, p.HV}},        {&b.da, {TT, p.HV, Kg}},     {&b.dx, {TT, p.HV, Kg}},
      {&b.dalog, {TT, p.HV, Kg}},      {&b.dAc, {NT, p.HV, 64, 64}}, {&b.Wc, {NT, p.HV, 64, 64}},
      {&b.part, {TT, p.HV, kPartSlots}}};
  std::vector<const TensorView*> alias;
  size_t total = 0;
  for (const auto& it : items) {
    *it.first = TensorView(nullptr, DType::f32, it.second, Device::cuda);  // the shape, for backward_alias
    alias.push_back(im.backward_alias(it.first));
    if (!alias.back()) total += round_up(sizeof(float) * size_t(shape_numel(it.second)));
  }
  if (total > im.bws_bytes) {
    KCP_CUDA_CHECK(cudaFree(im.d_bws));
    im.d_bws = nullptr;
    KCP_CUDA_CHECK(cudaMalloc(&im.d_bws, total));
    im.bws_bytes = total;
  }
  size_t off = 0;
  for (size_t i = 0; i < std::size(items); ++i) {
    const auto& it = items[i];
    void* data = alias[i] ? alias[i]->data : static_cast<char*>(im.d_bws) + off;
    *it.first = TensorView(data, DType::f32, it.second, Device::cuda);
    if (!alias[i]) off += round_up(sizeof(float) * size_t(shape_numel(it.second)));
  }
}

// Forward recompute (with h and vnew when keep_states), the backward workspace, and the parameter block.
BwdParams Pipeline::Impl::backward_setup(const Problem& p, const Inputs& in, int64_t seq_first, int64_t seq_count,
                                         bool keep_states, bool recompute) {
  Impl& im = *this;
  // kda with 16-bit inputs recomputes h and vnew on the chain the kept forward would take
  // (kept_chain_transposed); without a recompute the slot of kg holds what the kept forward's WY wrote
  // there (kg or kg^T)
  const bool kgt = recompute ? keep_states && im.kept_chain_transposed(p) : im.kept.kgt;
  const Setup st = im.setup(p, in, seq_first, seq_count, true, kgt);
  im.size_backward_workspace(p);
  // u is read only by the unfolded state kernel of the recompute: not by the folded one (gdn with
  // 16-bit inputs, which forms vnew from v), nor by any backward kernel, nor by the transition's chains.
  if (recompute) im.run_front(st, keep_states && !state_fold_applies(st.c, st.dtype));
  if (keep_states && recompute) {
    StateParams sp;
    sp.c = st.c;
    sp.Vw = int(p.V), sp.u = st.c.u;  // gla: u = v
    sp.init = in.initial_state.empty() || seq_count >= 0 ? kInitZero : kInitGiven;
    if (sp.init == kInitGiven) sp.h0 = state_view(in.initial_state, p.flags.state_v_first, "initial_state");
    sp.h = static_cast<float*>(im.buf.h.data);
    sp.vnew = st.c.gla ? nullptr : static_cast<float*>(im.buf.vnew.data);  // gla: vnew = v (kernel hv reads v)
    // gdn with 16-bit inputs: the folded kernel, as in the forward; gla of one sequence: its halves, as
    // the kept forward (the same h bit for bit)
    if (!im.gla_halves(sp, st.dtype, true)) im.launch_state(sp, st.dtype);
  }
  BwdParams bp;
  bp.c = st.c;
  auto f = [](const TensorView& t) { return static_cast<float*>(t.data); };
  const BackwardBuffers& b = im.bbuf;
  bp.h = f(im.buf.h), bp.vnew = st.c.gla ? nullptr : f(im.buf.vnew);
  bp.dh = f(b.dh), bp.dvnew = f(b.dvnew), bp.dqv = f(b.dqv), bp.dkv = f(b.dkv);
  bp.dbeta_e = f(b.dbeta_e), bp.da = f(b.da), bp.dx = f(b.dx), bp.dalog = f(b.dalog);
  bp.dAc = f(b.dAc), bp.Wc = f(b.Wc), bp.part = f(b.part);
  bp.Vw = int(p.V);
  return bp;
}

// A kept record without dhu_local terms (a forward, then its backward: the common order) is used at
// once: the kernels read it while the inputs' fingerprint runs beside the state-gradient chain, and
// the host waits for that fingerprint alone after the last launch. Inputs changed in place since the
// forward (another fingerprint) make the backward run again with the recompute, overwriting every
// gradient in stream order before this call returns. With terms (the CP layer's order: a
// transition_backward or backward_prepare left them) both fingerprints are compared first, and not
// at all while set_inputs_unchanged vouches for the contents.
void Pipeline::backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) {
  check_cotangents(p, d);
  check_grads(p, in, gr);
  DeviceGuard guard(impl_->device);
  Impl& im = *impl_;
  im.front.valid = false;
  if (!im.trusted && im.keep_speculate(p, in)) {
    im.run_backward(p, in, d, gr, true, false, true);
    if (!im.speculation_held()) im.run_backward(p, in, d, gr, false, false, false);
    return;
  }
  const bool kept = im.keep_matches(p, in);  // the kept forward's workspace: no recompute
  // and a transition_backward's dhu_local terms for this do: no dhu_local
  const bool terms = kept && im.kept_terms_match(d.d_o, true);
  im.run_backward(p, in, d, gr, kept, terms, false);
}

void Pipeline::Impl::run_backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr, bool kept,
                                  bool terms, bool speculate) {
  StageTimer timer(stream);
  timer.mark();
  BwdParams bp = backward_setup(p, in, 0, -1, true, !kept);
  timer.mark();
  bp.d_o = rows_view<RowsView>(d.d_o, "d_o");
  if (!d.d_final_state.empty()) bp.dht = state_view(d.d_final_state, p.flags.state_v_first, "d_final_state");
  if (!gr.d_initial_state.empty()) bp.dh0 = state_view(gr.d_initial_state, p.flags.state_v_first, "d_initial_state");
  bp.dq = out_rows(gr.dq, "dq"), bp.dk = out_rows(gr.dk, "dk"), bp.dv = out_rows(gr.dv, "dv");
  bp.dg = out_rows(gr.dg, "dg"), bp.dbeta = out_rows(gr.dbeta, "dbeta");
  if (!in.A_log.empty()) bp.dA_log = out_scalar(gr.dA_log, "dA_log");
  if (!in.dt_bias.empty()) bp.ddt_bias = out_scalar(gr.ddt_bias, "ddt_bias");
  bp.direct_qk = direct_qk_outputs(bp), bp.direct_dg = direct_dg_output(bp);
  bp.gla_dh_chain = gla_dh_chain_applies(bp);
  bp.dhu_forms_local = dhu_forms_local_applies(bp);
  gla_dh_halves(bp);
  if (!terms) launch_bwd_dhu_local(bp, stream);  // = launch_bwd_dhu, timed in parts
  timer.mark();
  if (speculate) fork_side();
  launch_bwd_dhu_serial(bp, stream);
  if (speculate) fingerprint_beside(in);
  timer.mark();
  if (NT > 0) {  // = launch_bwd_chunk, timed in parts
    launch_bwd_hv(bp, stream);
    timer.mark();
    launch_bwd_wy(bp, stream);
    timer.mark();
    launch_bwd_intra(bp, stream);
    timer.mark();
    launch_bwd_chunk_sum(bp, stream);
  }
  launch_bwd_finish(bp, stream);
  timer.mark();
  static const char* const kNames[] = {"recompute", "dhu-local", "dhu", "chunk-hv", "chunk-wy", "chunk-intra", "sum+finish"};
  timer.report("backward", kNames);
}

const BackwardBuffers& Pipeline::backward_buffers() const { return impl_->bbuf; }
const StageBuffers& Pipeline::buffers() const { return impl_->buf; }

void Pipeline::transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                                   const TensorView& packed) {
  const int64_t count = check_transition_call(p, seq_begin, packed, Device::cuda, "transition_backward", true);
  KCP_CHECK(d_o.shape == shape_v(p), "transition_backward: d_o: expected shape ", shape_str(shape_v(p)), ", got ",
            shape_str(d_o.shape));
  impl_->front.valid = false;
  if (count == 0) return;
  DeviceGuard guard(impl_->device);
  // A kept forward of these very sequences (all of them) left the front stages: read them, and leave
  // the record to the local backward that follows (chunkwise_keep.cu); else it is dropped.
  const bool kept = seq_begin == 0 && count == p.N ? impl_->keep_matches(p, in, false) : (impl_->kept.valid = false);
  StageTimer timer(impl_->stream);
  timer.mark();
  // The chains read neither the forward states nor vnew: no state recompute (keep_states = false).
  BwdParams bp = impl_->backward_setup(p, in, seq_begin, count, false, !kept);
  timer.mark();
  bp.d_o = rows_view<RowsView>(d_o, "d_o");
  // kg, and the dS_ext columns' A_c, B_c (into dvnew, dh), unless a backward_prepare (or an earlier
  // transition) left them for this do; the local backward that follows may reuse them
  if (!kept || !impl_->kept_terms_match(d_o, false)) {
    launch_bwd_dhu_local(bp, impl_->stream);
    if (kept) impl_->keep_terms(d_o);
  }
  timer.mark();
  // dS_ext (from 0, with do: columns [0, V)) and M^T (from I, do = 0: columns [V, V + K)) as the columns
  // of one chain launch, of which only the end is kept; the S part alone (dS_ext) as the local
  // backward's chain from 0, V columns.
  bp.keep = false, bp.dh0 = state_view(packed, false, "transition");
  if (transition_s_only(p, packed)) bp.init = kInitZero, bp.Vw = int(p.V);
  else bp.init = kInitTransition, bp.Vw = int(p.V + p.K);
  launch_bwd_dhu_serial(bp, impl_->stream);
  timer.mark();
  static const char* const kNames[] = {"front", "dhu-local", "dhu"};
  timer.report("transition_backward", kNames);
}

}  // namespace kcp::cuda
