// The kept forward (Pipeline::set_keep_forward, chunkwise.h): the forward runs the backward's
// recompute stages with the output fused in, so that the backward that follows on the same inputs
// finds its forward intermediates in the workspace:
//   forward_kept:  cumsum -> kkt + solve -> WY (w; u only for the unfolded state kernel) -> state
//                  writing o, final_state, h and vnew (= backward_setup's recompute, plus o; kda on
//                  the transposed chain where kept_chain_transposed says so, then in windows where
//                  window_plan does: chunkwise_windows.cu);
//                  F0 = fingerprint of the inputs (input_fingerprint.cuh) on the side stream beside
//                  the state kernel (its chain waits on step latency and leaves the device mostly
//                  idle); the problem kept.
//   keep_speculate: the next call is a backward of the same problem, inputs of the same dtypes and
//                  shapes (host checks): its kernels read the record at once, F1 runs beside its dhu
//                  chain, and after the last launch the host waits for F1 alone; F1 != F0 (inputs
//                  changed in place) runs the backward again with the recompute (kept_redos).
//   keep_matches:  the same with F1 compared first (read back: one host synchronization): the CP
//                  layer's order below, where dhu_local's terms are in the record too.
// While set_inputs_unchanged is on (the CP layer around a rank's local pass after its transition or
// prepare, on the same views), the checks compare problem, dtypes and shapes only: no F1, F3 or F5
// is hashed and nothing is read back (contents_held).
// The record is dropped by any other call and by the backward that uses it (the backward's own
// buffers live in dead forward buffers, chunkwise_backward.cu's backward_alias), except by a
// transition_backward of all sequences (CP's backward runs one before the local backward): that call
// reads the kept front stages (gate cumsum, P, Aqk, w) instead of recomputing them and writes only
// buffers no reader of the record needs (kg, u: dead; dh, dvnew: the backward's own, rewritten).
// Those it writes are dhu_local's terms (kg -> dkv, A_c -> dvnew, B_c -> dh[c]) from the inputs and its
// do; its chains write neither dh[c] nor dvnew. keep_terms fingerprints that do (F2); a backward (or
// another transition_backward) that reuses the record and whose do gives F3 = F2 (same dtype and
// shape) skips dhu_local too. backward_prepare (Backend::backward_prepare: a CP rank with no
// transition to run, while it waits) runs dhu_local alone on the record and leaves the same terms.
// Before the forward, in the same way: a transition_forward of all sequences with keep_forward, or
// forward_prepare (the CP rank with no forward transition), leaves the front stages and F4, the
// fingerprint of q .. dt_bias (not the initial state: the front stages do not read it); a kept
// forward whose F5 = F4 skips them (front_matches) and sets F0 = F4 + F(initial_state).
// Covered by tests/cuda/test_cuda_keep.cpp.
#include <algorithm>
#include <array>
#include <span>

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunkwise_impl.cuh"
#include "cuda/device_guard.cuh"
#include "cuda/input_fingerprint.cuh"
#include "cuda/stage_timer.cuh"

namespace kcp::cuda {
namespace {

bool same_flags(const Flags& a, const Flags& b) {
  return a.use_qk_l2norm_in_kernel == b.use_qk_l2norm_in_kernel && a.use_beta_sigmoid_in_kernel == b.use_beta_sigmoid_in_kernel &&
         a.allow_neg_eigval == b.allow_neg_eigval && a.use_gate_in_kernel == b.use_gate_in_kernel &&
         a.lower_bound == b.lower_bound && a.safe_gate == b.safe_gate && a.state_v_first == b.state_v_first;
}

bool same_problem(const Problem& a, const Problem& b) {
  return a.variant == b.variant && a.B == b.B && a.T == b.T && a.H == b.H && a.HV == b.HV && a.K == b.K && a.V == b.V &&
         a.N == b.N && a.chunk_size == b.chunk_size && a.scale == b.scale && same_flags(a.flags, b.flags) &&
         a.cu_seqlens == b.cu_seqlens && a.compute == b.compute;
}

// Every input the forward intermediates depend on, in a fixed order (its index salts the fingerprint).
std::array<const TensorView*, 8> kept_inputs(const Inputs& in) {
  return {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.A_log, &in.dt_bias, &in.initial_state};
}

constexpr size_t kFrontInputs = 7;  // all but initial_state: the front stages do not read it

std::vector<std::pair<DType, Shape>> view_keys(const Inputs& in, size_t n = 8) {
  std::vector<std::pair<DType, Shape>> keys;
  for (const TensorView* t : kept_inputs(in))
    if (keys.size() < n) keys.emplace_back(t->dtype, t->empty() ? Shape{} : t->shape);
  return keys;
}

// *slot = the sum over the first n inputs (salts 1 .. n); a sum, so F(all 8) = F(first 7) + F(h0).
void fingerprint_inputs(const Inputs& in, unsigned long long* slot, cudaStream_t stream, size_t n = 8) {
  KCP_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(unsigned long long), stream));
  const auto inputs = kept_inputs(in);
  std::array<FingerprintInput, std::tuple_size_v<decltype(inputs)>> views;
  for (size_t i = 0; i < inputs.size(); ++i) views[i] = {inputs[i], uint64_t(i + 1)};
  launch_fingerprint_add(std::span(views.data(), std::min(n, views.size())), slot, stream);  // one launch for the contiguous ones
}

// *slot = F(d_o) (its salt, 9, follows the inputs').
void fingerprint_do(const TensorView& d_o, unsigned long long* slot, cudaStream_t stream) {
  KCP_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(unsigned long long), stream));
  launch_fingerprint_add(d_o, 9, slot, stream);
}

// Whether the device fingerprints pair[0] and pair[1] are equal (read back: one host synchronization).
bool fingerprints_equal(const unsigned long long* pair, cudaStream_t stream) {
  unsigned long long f[2] = {0, 1};
  KCP_CUDA_CHECK(cudaMemcpyAsync(f, pair, sizeof f, cudaMemcpyDeviceToHost, stream));
  KCP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return f[0] == f[1];
}

// Whether the contents recorded as pair[0] are still there: hash(pair + 1), then compared (one host
// synchronization); taken as true, with no hash, while the caller vouches for them (`trusted`:
// set_inputs_unchanged).
template <class Hash>
bool contents_held(bool trusted, unsigned long long* pair, cudaStream_t stream, Hash&& hash) {
  if (trusted) return true;
  hash(pair + 1);
  return fingerprints_equal(pair, stream);
}

}  // namespace

void Pipeline::Impl::forward_kept(const Problem& p, const Inputs& in, const Outputs& out) {
  // h, vnew, w, u carved as backward_setup carves them; kda with 16-bit inputs takes the transposed chain
  // (kg^T in kg's slot) where kept_chain_transposed says so, as the backward's recompute does, or where
  // the kept front stages (a transition's) wrote kg^T: their WY is used as it is
  const Setup st = setup(p, in, 0, -1, true, front.valid ? front.kgt : kept_chain_transposed(p));
  const bool fold = state_fold_applies(st.c, st.dtype);
  if (!d_fp) KCP_CUDA_CHECK(cudaMalloc(&d_fp, 6 * sizeof(unsigned long long)));
  StageTimer timer(stream);
  timer.mark();
  const bool front_wy = front.wy && front.kgt == (st.c.kg_t != nullptr);  // WY as this chain reads it
  const bool reuse = front_matches(p, in);  // F5 = the front inputs' fingerprint, when it compares
  StateParams sp = state_params(st, p, in, out);
  sp.o = rows_view<OutRowsView>(out.o, "o");
  sp.h = static_cast<float*>(buf.h.data);
  sp.vnew = st.c.gla ? nullptr : static_cast<float*>(buf.vnew.data);  // gla: vnew = v (kernel hv reads v)
  // kda: kkt and WY of window w + 1 beside the chain of window w (chunkwise_windows.cu), F0 after them
  const WindowPlan window = reuse ? WindowPlan{} : admitted_window_plan(sp);
  if (window.chunks) {
    launch_chunk_cumsum(st.c, st.dtype, stream);
    run_windows(sp, st.dtype, window);
  } else {
    if (!reuse) run_front(st, !fold);  // u: read by the unfolded state kernel only
    else if (!front_wy) launch_chunk_wy(st.c, st.dtype, stream, !fold);
  }
  timer.mark();
  if (!reuse && !window.chunks) fork_side();  // after the front stages, which fill the device: F0 runs beside the chain
  if (!window.chunks) forward_state(sp, st.dtype, true);
  if (!reuse) fingerprint_inputs(in, d_fp, side);  // queued after the chain (or the last window's front)
  timer.mark();
  if (!reuse) {
    KCP_CUDA_CHECK(cudaEventRecord(join_ev, side));
    KCP_CUDA_CHECK(cudaStreamWaitEvent(stream, join_ev, 0));
  } else {  // F0 = F4 (= F5 where compared) + F(initial_state), salted as fingerprint_inputs salts it
    KCP_CUDA_CHECK(cudaMemcpyAsync(d_fp, d_fp + 4, sizeof(unsigned long long), cudaMemcpyDeviceToDevice, stream));
    launch_fingerprint_add(in.initial_state, kFrontInputs + 1, d_fp, stream);
  }
  kept.p = p, kept.views = view_keys(in), kept.valid = true, kept.terms = false, kept.kgt = st.c.kg_t != nullptr;
  sched.kept = true, sched.front_reused = reuse;
  timer.mark();
  static const char* const kNames[] = {"front", "state+output", "fingerprint"};
  timer.report("forward (kept)", kNames);
}

void Pipeline::Impl::keep_front(const Problem& p, const Inputs& in, bool wy, bool kgt) {
  if (!d_fp) KCP_CUDA_CHECK(cudaMalloc(&d_fp, 6 * sizeof(unsigned long long)));
  fingerprint_inputs(in, d_fp + 4, stream, kFrontInputs);
  front.p = p, front.views = view_keys(in, kFrontInputs), front.wy = wy, front.kgt = kgt, front.valid = true;
}

bool Pipeline::Impl::front_matches(const Problem& p, const Inputs& in) {
  if (!front.valid) return false;
  front.valid = false;
  if (!same_problem(front.p, p) || front.views != view_keys(in, kFrontInputs)) return false;
  if (!contents_held(trusted, d_fp + 4, stream, [&](auto* f5) { fingerprint_inputs(in, f5, stream, kFrontInputs); }))
    return false;
  ++kept_front_reuses;
  return true;
}

void Pipeline::forward_prepare(const Problem& p, const Inputs& in) {
  DeviceGuard guard(impl_->device);
  impl_->kept.valid = impl_->front.valid = false;
  if (!impl_->keep_forward) return;
  const Impl::Setup st = impl_->setup(p, in, 0, -1, true, impl_->kept_chain_transposed(p));
  impl_->run_front(st, !state_fold_applies(st.c, st.dtype));  // as forward_kept runs them
  impl_->keep_front(p, in, true, st.c.kg_t != nullptr);
}

bool Pipeline::Impl::keep_matches(const Problem& p, const Inputs& in, bool consume) {
  if (!kept.valid) return false;
  kept.valid = false;  // one backward per kept forward; a matching transition_backward restores it below
  if (!same_problem(kept.p, p) || kept.views != view_keys(in)) return false;
  if (!contents_held(trusted, d_fp, stream, [&](auto* f1) { fingerprint_inputs(in, f1, stream); })) return false;
  ++kept_reuses;
  kept.valid = !consume;
  return true;
}

void Pipeline::Impl::fork_side() {
  if (!side) {
    KCP_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    KCP_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
    KCP_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
    KCP_CUDA_CHECK(cudaMallocHost(&h_fp, 2 * sizeof(unsigned long long)));
  }
  KCP_CUDA_CHECK(cudaEventRecord(fork_ev, stream));
  KCP_CUDA_CHECK(cudaStreamWaitEvent(side, fork_ev, 0));
}

bool Pipeline::Impl::keep_speculate(const Problem& p, const Inputs& in) {
  if (!kept.valid || kept.terms) return false;
  kept.valid = false;  // the backward's buffers live in dead forward buffers: one use, right or wrong
  return same_problem(kept.p, p) && kept.views == view_keys(in);
}

// F1 on `side` (forked before the chain was queued, so that the chain's blocks go first), then
// F0, F1 to the host.
void Pipeline::Impl::fingerprint_beside(const Inputs& in) {
  fingerprint_inputs(in, d_fp + 1, side);
  KCP_CUDA_CHECK(cudaMemcpyAsync(h_fp, d_fp, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, side));
  KCP_CUDA_CHECK(cudaEventRecord(join_ev, side));
}

bool Pipeline::Impl::speculation_held() {
  KCP_CUDA_CHECK(cudaEventSynchronize(join_ev));  // the fingerprint alone, not the kernels queued beside it
  const bool held = h_fp[0] == h_fp[1];
  ++(held ? kept_reuses : kept_redos);
  return held;
}

void Pipeline::Impl::keep_terms(const TensorView& d_o) {
  fingerprint_do(d_o, d_fp + 2, stream);
  kept.terms = true, kept.do_key = {d_o.dtype, d_o.shape};
}

bool Pipeline::Impl::kept_terms_match(const TensorView& d_o, bool consume) {
  if (!kept.terms) return false;
  kept.terms = !consume;  // a backward rewrites dh[c] and dvnew
  if (kept.do_key != std::make_pair(d_o.dtype, d_o.shape)) return false;
  if (!contents_held(trusted, d_fp + 2, stream, [&](auto* f3) { fingerprint_do(d_o, f3, stream); })) return false;
  ++kept_term_reuses;
  return true;
}

void Pipeline::backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) {
  DeviceGuard guard(impl_->device);
  impl_->front.valid = false;
  if (!impl_->keep_matches(p, in, false)) return;  // without a kept forward the recompute would overwrite them
  BwdParams bp = impl_->backward_setup(p, in, 0, -1, true, false);
  bp.d_o = rows_view<RowsView>(d_o, "d_o");
  launch_bwd_dhu_local(bp, impl_->stream);
  impl_->keep_terms(d_o);
}

int64_t Pipeline::kept_reuses() const { return impl_->kept_reuses; }
int64_t Pipeline::kept_term_reuses() const { return impl_->kept_term_reuses; }
int64_t Pipeline::kept_front_reuses() const { return impl_->kept_front_reuses; }
int64_t Pipeline::kept_redos() const { return impl_->kept_redos; }
void Pipeline::set_inputs_unchanged(bool on) { impl_->trusted = on; }

}  // namespace kcp::cuda
