// PaddedBackend: a Backend that serves K, V and chunk sizes its inner backend's kernels are not
// instantiated for, exactly, by zero padding (plan: core/pad_plan.h). The registry wraps cuda-chunkwise
// with it outermost (validation/registry.cpp): padded once per call, so the segmented forward inside
// plans on the padded problem and its cuts lie on the chunk grid the kernels compute with (C = 64).
// Why a wrapper over the Backend interface rather than code in cuda/: it needs only the queue's view
// operations (pad_view, copy_view), so the same code runs on the host queue, where
// tests/core/test_padded.cpp checks it against the float64 oracle without a GPU, and on the CUDA queue
// (one strided pad kernel per tensor, cuda/queue_ops.cu); the kernels stay untouched.
//
// Why zero padding is exact (K -> Kp with q = k = 0 and g = 0 in the padded channels; V -> Vp with
// v = 0; h0 zero in the padded rows and columns; d_o = 0 and d_final_state = 0 in the padded columns):
//   - the state S [Kp,Vp] evolves S' = D (I - b k k^T) S + b k v^T (gla: S' = D S + k v^T), D diagonal.
//     With k_p = 0 the padded rows get S'_p = D_p S_p: zero forever from a zero h0, whatever their decay
//     D_p (the in-kernel gate formula gives padded channels a finite decay from g = dt_bias = 0; it
//     multiplies zeros). k^T S, the real rows' update, sums k_p S_p = 0 terms. With v_p = 0 the padded
//     columns stay zero the same way. o = S^T (scale q) sums q_p S_p = 0 terms; o's padded columns are
//     dropped. scale is the caller's K^-0.5 (pad_plan.h), not Kp's.
//   - the L2 norm of q, k adds 0^2 terms: unchanged; its backward gives zero to the padded channels.
//   - backward: dL/dS is zero in the padded rows (nothing reads them: q_p = k_p = 0, d_final_state's
//     padded rows are 0) and columns (d_o and d_final_state columns 0, v_p = 0); every gradient of a
//     padded channel is a sum of products with S_p, dS_p, q_p or k_p, so dq, dk, dg and the per-token
//     log-decay gradient da of padded channels are 0, and the sums over channels (dbeta over V, dA_log
//     over K of da * da/dA_log, a finite factor) get exact zeros from them. The padded entries of dq,
//     dk, dv, dg, dh0 and ddt_bias are dropped.
//   - transitions: M of the padded problem is block diagonal, diag(M, D_pad), since k_p = 0 couples
//     nothing; S_ext and dS_ext are zero in the padded rows and columns. The caller's (S, M) is the
//     leading [K, V] and [K, K] corner (pad_plan.h padded_transition_s/m).
// Products with exact zeros add exact zeros, so the padded result is the unpadded chunkwise function
// up to float summation order. Tensors without a K or V axis (beta, gdn's g and dt_bias, A_log, dbeta,
// dA_log) pass through; padded copies keep the caller's dtypes (pad and unpad are exact copies).
// Workspace: one buffer per padded tensor kept between calls (grown when a call needs more).
// Covered by tests/core/test_padded.cpp (host, against the oracle) and tests/cuda/test_cuda_shapes.cpp.
#pragma once

#include <array>
#include <memory>

#include "core/forwarding_backend.h"
#include "core/pad_plan.h"

namespace kcp {

class PaddedBackend final : public ForwardingBackend {
 public:
  PaddedBackend(std::unique_ptr<Backend> inner, PadRule rule);

  Support supports(const Problem& p) const override;
  Support supports_backward(const Problem& p) const override;
  void forward(const Problem& p, const Inputs& in, const Outputs& out) override;
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) override;
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) override;
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                           const TensorView& packed) override;
  std::string explain_forward(const Problem& p) const override;

  PadPlan plan(const Problem& p) const { return plan_padding(p, rule_); }
  const PadRule& rule() const { return rule_; }

 private:
  enum class Slot { q, k, v, g, dt_bias, h0, o, ht, d_o, dht, dq, dk, dv, dg, dh0, ddt, packed, count };
  TensorView slot(Slot s, DType dt, const Shape& shape);
  TensorView pad_in(Slot s, const TensorView& src, const Shape& padded);
  TensorView out_buf(Slot s, const TensorView& dst, const Shape& padded);
  void unpad(const TensorView& dst, const TensorView& padded);
  void unpad_transition(const TensorView& packed, const TensorView& pk, const PadPlan& pl);
  Inputs pad_inputs(const PadPlan& pl, const Inputs& in, bool with_state);
  void check_device(const TensorView& t, const char* what) const;

  PadRule rule_;
  std::array<DeviceBuffer, size_t(Slot::count)> ws_;
};

std::unique_ptr<Backend> make_padded_backend(std::unique_ptr<Backend> inner, PadRule rule);

}  // namespace kcp
