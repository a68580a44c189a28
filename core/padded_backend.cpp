// PaddedBackend (see padded_backend.h): pad on the queue, call the inner backend on the padded problem,
// copy the caller's corner back.
#include "core/padded_backend.h"

#include <algorithm>

#include "core/transition.h"

namespace kcp {
namespace {

constexpr size_t kAlign = 256;  // every padded tensor starts 256-byte aligned (the kernels' 16-byte rows)

}  // namespace

PaddedBackend::PaddedBackend(std::unique_ptr<Backend> inner, PadRule rule)
    : ForwardingBackend(std::move(inner)), rule_(std::move(rule)) {}

Support PaddedBackend::supports(const Problem& p) const {
  const PadPlan pl = plan(p);
  return pl.support ? inner().supports(pl.padded) : pl.support;
}

Support PaddedBackend::supports_backward(const Problem& p) const {
  const PadPlan pl = plan(p);
  return pl.support ? inner().supports_backward(pl.padded) : pl.support;
}

std::string PaddedBackend::explain_forward(const Problem& p) const {
  const PadPlan pl = plan(p);
  const std::string in = inner().explain_forward(pl.padded), own = pl.changes() ? pl.describe() : "";
  return own.empty() ? in : in.empty() ? own : own + "; " + in;
}

// A contiguous tensor of the workspace: slot s's buffer, grown when too small (released buffers are
// freed after the work queued on them: cudaFree waits for the device).
TensorView PaddedBackend::slot(Slot s, DType dt, const Shape& shape) {
  const size_t bytes = (size_t(shape_numel(shape)) * size_t(dtype_size(dt)) + kAlign - 1) / kAlign * kAlign;
  DeviceBuffer& b = ws_[size_t(s)];
  if (b.bytes() < bytes || !b.get()) b = DeviceBuffer(queue(), std::max(bytes, kAlign));
  return TensorView(b.get(), dt, shape, device());
}

// The padded copy of src (its dtype, zeros outside its extent), or src itself when nothing pads.
TensorView PaddedBackend::pad_in(Slot s, const TensorView& src, const Shape& padded) {
  if (src.empty() || src.shape == padded) return src;
  const TensorView dst = slot(s, src.dtype, padded);
  queue().pad_view(dst, src);
  return dst;
}

// Where the inner backend writes an output of the padded shape: the workspace, or dst itself when
// its shape is unchanged.
TensorView PaddedBackend::out_buf(Slot s, const TensorView& dst, const Shape& padded) {
  if (dst.empty() || dst.shape == padded) return dst;
  return slot(s, dst.dtype, padded);
}

// dst = the leading corner of `padded` (nothing when the inner backend wrote dst itself).
void PaddedBackend::unpad(const TensorView& dst, const TensorView& padded) {
  if (dst.empty() || padded.data == dst.data) return;
  queue().copy_view(dst, padded.leading(dst.shape));
}

// The caller's packed [count,HV,K,V+K] from the padded [count,HV,Kp,Vp+Kp]: S and M corners.
void PaddedBackend::unpad_transition(const TensorView& packed, const TensorView& pk, const PadPlan& pl) {
  queue().copy_view(packed.narrow(3, 0, pl.V), padded_transition_s(pk, pl.K, pl.V));
  queue().copy_view(packed.narrow(3, pl.V, pl.K), padded_transition_m(pk, pl.K, pl.Vp));
}

void PaddedBackend::check_device(const TensorView& t, const char* what) const {
  KCP_CHECK(t.empty() || t.device == device(), name(), ": ", what, " must live on the backend's device");
}

Inputs PaddedBackend::pad_inputs(const PadPlan& pl, const Inputs& in, bool with_state) {
  const Problem& p = pl.padded;
  for (auto [t, n] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.g, "g"}, {&in.beta, "beta"},
                      {&in.A_log, "A_log"}, {&in.dt_bias, "dt_bias"}, {&in.initial_state, "initial_state"}})
    check_device(*t, n);
  Inputs r = in;
  r.q = pad_in(Slot::q, in.q, shape_qk(p)), r.k = pad_in(Slot::k, in.k, shape_qk(p));
  r.v = pad_in(Slot::v, in.v, shape_v(p)), r.g = pad_in(Slot::g, in.g, shape_g(p));
  if (p.per_channel_gate() && !in.dt_bias.empty() && pl.Kp != pl.K) {  // [HV*K] -> [HV*Kp] as [HV,K] -> [HV,Kp]
    r.dt_bias = slot(Slot::dt_bias, in.dt_bias.dtype, shape_dt_bias(p));
    queue().pad_view(pad_heads(r.dt_bias, p.HV, pl.Kp), pad_heads(in.dt_bias, p.HV, pl.K));
  }
  r.initial_state = with_state ? pad_in(Slot::h0, in.initial_state, shape_state(p)) : TensorView();
  return r;
}

void PaddedBackend::forward(const Problem& p, const Inputs& in, const Outputs& out) {
  const PadPlan pl = plan(p);
  if (!pl.changes()) return inner().forward(p, in, out);
  require_support(*this, p);
  if (!pl.pads()) return inner().forward(pl.padded, in, out);
  check_outputs(p, out);
  check_device(out.o, "o"), check_device(out.final_state, "final_state");
  const Problem& pp = pl.padded;
  const Inputs pin = pad_inputs(pl, in, true);
  const Outputs pout{out_buf(Slot::o, out.o, shape_v(pp)), out_buf(Slot::ht, out.final_state, shape_state(pp))};
  inner().forward(pp, pin, pout);
  unpad(out.o, pout.o), unpad(out.final_state, pout.final_state);
}

void PaddedBackend::backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) {
  const PadPlan pl = plan(p);
  if (!pl.changes()) return inner().backward(p, in, d, gr);
  require_backward_support(*this, p);
  if (!pl.pads()) return inner().backward(pl.padded, in, d, gr);
  check_cotangents(p, d), check_grads(p, in, gr);
  for (auto [t, n] : {std::pair{&d.d_o, "d_o"}, {&d.d_final_state, "d_final_state"}, {&gr.dq, "dq"}, {&gr.dk, "dk"},
                      {&gr.dv, "dv"}, {&gr.dg, "dg"}, {&gr.dbeta, "dbeta"}, {&gr.d_initial_state, "d_initial_state"},
                      {&gr.dA_log, "dA_log"}, {&gr.ddt_bias, "ddt_bias"}})
    check_device(*t, n);
  const Problem& pp = pl.padded;
  const Inputs pin = pad_inputs(pl, in, true);
  const Cotangents pd{pad_in(Slot::d_o, d.d_o, shape_v(pp)), pad_in(Slot::dht, d.d_final_state, shape_state(pp))};
  Grads pg = gr;
  pg.dq = out_buf(Slot::dq, gr.dq, shape_qk(pp)), pg.dk = out_buf(Slot::dk, gr.dk, shape_qk(pp));
  pg.dv = out_buf(Slot::dv, gr.dv, shape_v(pp)), pg.dg = out_buf(Slot::dg, gr.dg, shape_g(pp));
  pg.d_initial_state = out_buf(Slot::dh0, gr.d_initial_state, shape_state(pp));
  if (pp.per_channel_gate() && !gr.ddt_bias.empty() && pl.Kp != pl.K)
    pg.ddt_bias = slot(Slot::ddt, gr.ddt_bias.dtype, shape_dt_bias(pp));
  inner().backward(pp, pin, pd, pg);
  unpad(gr.dq, pg.dq), unpad(gr.dk, pg.dk), unpad(gr.dv, pg.dv), unpad(gr.dg, pg.dg);
  unpad(gr.d_initial_state, pg.d_initial_state);
  if (pg.ddt_bias.data != gr.ddt_bias.data)
    unpad(pad_heads(gr.ddt_bias, p.HV, pl.K), pad_heads(pg.ddt_bias, p.HV, pl.Kp));
}

void PaddedBackend::transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin,
                                       const TensorView& packed) {
  const PadPlan pl = plan(p);
  if (!pl.changes()) return inner().transition_forward(p, in, seq_begin, packed);
  require_support(*this, p);
  if (!pl.pads()) return inner().transition_forward(pl.padded, in, seq_begin, packed);
  const int64_t count = check_transition_call(p, seq_begin, packed, device(), "transition_forward");
  const Inputs pin = pad_inputs(pl, in, false);
  const TensorView pk = slot(Slot::packed, p.compute, transition_shape(count, p.HV, pl.Kp, pl.Vp));
  inner().transition_forward(pl.padded, pin, seq_begin, pk);
  unpad_transition(packed, pk, pl);
}

void PaddedBackend::transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                                        const TensorView& packed) {
  const PadPlan pl = plan(p);
  if (!pl.changes()) return inner().transition_backward(p, in, d_o, seq_begin, packed);
  require_backward_support(*this, p);
  if (!pl.pads()) return inner().transition_backward(pl.padded, in, d_o, seq_begin, packed);
  const int64_t count = check_transition_call(p, seq_begin, packed, device(), "transition_backward", true);
  KCP_CHECK(d_o.shape == shape_v(p), "d_o: expected shape [B,T,HV,V] = ", shape_str(shape_v(p)), ", got ",
            shape_str(d_o.shape));
  check_device(d_o, "d_o");
  const Inputs pin = pad_inputs(pl, in, false);
  const TensorView pdo = pad_in(Slot::d_o, d_o, shape_v(pl.padded));
  const bool s_only = transition_s_only(p, packed);  // dS_ext alone: the padded call asks for it alone too
  const TensorView pk = slot(Slot::packed, p.compute, s_only ? transition_s_shape(count, p.HV, pl.Kp, pl.Vp)
                                                             : transition_shape(count, p.HV, pl.Kp, pl.Vp));
  inner().transition_backward(pl.padded, pin, pdo, seq_begin, pk);
  if (s_only) queue().copy_view(packed, padded_transition_s(pk, pl.K, pl.V));
  else unpad_transition(packed, pk, pl);
}

std::unique_ptr<Backend> make_padded_backend(std::unique_ptr<Backend> inner, PadRule rule) {
  return std::make_unique<PaddedBackend>(std::move(inner), std::move(rule));
}

}  // namespace kcp
