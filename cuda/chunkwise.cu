// Pipeline: turns a Problem and device views into the kernels' parameter block, keeps the chunk
// table and the float32 workspace on the device between calls (re-uploading the table only when the
// sequence layout changes), and launches the stages in order.
// Workspace per call, float32: gcum TT*HV*Kg, beta TT*HV, rstd 2*TT*H (l2norm), P and Aqk
// 2*NT*HV*64*64 (gla: Aqk only), kda's gram G NT*HV*64*64 (kkt writes it for the backward's WY
// kernel; not in a forward without keep), w TT*HV*K and u TT*HV*V (not for the folded gdn forward with 16-bit
// inputs, nor gla), kg and qg 2*TT*HV*K (kda, gla; kda's plain forward with 16-bit inputs: kg^T
// NT*HV*K*64 and 2^(b_end) NT*HV*K instead of kg, for the transposed chain), h NT*HV*K*V (gla's output
// reads it; the stage tests) and vnew TT*HV*V (the stage tests).
// Covered by tests/cuda/test_cuda_forward.cpp, test_cuda_stages.cpp, test_cuda_transition.cpp,
// test_cuda_kda_chain.cpp.
#include "cuda/chunkwise.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/chunk_cumsum.cuh"
#include "cuda/chunk_kkt.cuh"
#include "cuda/chunk_output.cuh"
#include "cuda/chunk_state.cuh"
#include "cuda/chunk_state_fold.cuh"
#include "cuda/chunk_state_gla.cuh"
#include "cuda/chunk_state_kda.cuh"
#include "cuda/chunk_wy.cuh"
#include "core/transition.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_guard.cuh"
#include "cuda/key_dims.h"
#include "cuda/stage_timer.cuh"

#include "cuda/chunkwise_impl.cuh"

namespace kcp::cuda {

Pipeline::Impl::Setup Pipeline::Impl::setup(const Problem& p, const Inputs& in, int64_t seq_first, int64_t seq_count,
                                             bool stages, bool kgt) {
  KCP_CHECK(p.chunk_size == kChunk && key_dim_supported(p.K) && p.V % kValueTile == 0,
            "cuda-chunkwise: unsupported problem ", p.describe(), " (see supports())");
  Setup st;
  ChunkParams& c = st.c;
  // Views first, so that bad input is reported before any CUDA call.
  c.q = rows_view<RowsView>(in.q, "q"), c.k = rows_view<RowsView>(in.k, "k"), c.v = rows_view<RowsView>(in.v, "v");
  c.g = rows_view<RowsView>(in.g, "g");
  if (p.variant != Variant::gla) c.beta = rows_view<RowsView>(in.beta, "beta");  // gla has no beta
  KCP_CHECK(in.q.dtype == in.k.dtype && in.q.dtype == in.v.dtype, "cuda-chunkwise: q, k, v must share one dtype, got ",
            dtype_name(in.q.dtype), ", ", dtype_name(in.k.dtype), ", ", dtype_name(in.v.dtype));
  KCP_CHECK(c.q.dt != kF64, "cuda-chunkwise: q, k, v must be float32, float16 or bfloat16, got float64");
  expect_aligned_rows(in.q, "q"), expect_aligned_rows(in.k, "k"), expect_aligned_rows(in.v, "v");
  KCP_CHECK(in.q.stride[1] < (int64_t(1) << 24) && in.k.stride[1] < (int64_t(1) << 24),
            "cuda-chunkwise: q, k token strides must be below 2^24 elements (32-bit row offsets in a chunk)");
  KCP_CHECK(p.variant != Variant::gla || in.v.stride[1] < (int64_t(1) << 24),  // gla: the state kernel reads v rows
            "cuda-chunkwise: v's token stride must be below 2^24 elements for gla (32-bit row offsets in a chunk)");
  c.A_log = scalar_view(in.A_log, "A_log");
  c.dt_bias = scalar_view(in.dt_bias, "dt_bias");
  st.dtype = c.q.dt;
  c.B = int(p.B), c.T = int(p.T), c.H = int(p.H), c.HV = int(p.HV), c.K = int(p.K), c.V = int(p.V);
  c.G = int(p.G()), c.TT = p.B * p.T;
  c.scale = float(p.scale);
  c.kda = p.per_channel_gate();  // kda and gla
  c.gla = p.variant == Variant::gla;
  c.l2norm = p.flags.use_qk_l2norm_in_kernel;
  c.beta_sigmoid = p.flags.use_beta_sigmoid_in_kernel;
  c.beta_scale = p.flags.allow_neg_eigval ? 2.0f : 1.0f;
  c.gate = int(p.gate_formula());
  c.lower_bound = p.flags.lower_bound ? float(*p.flags.lower_bound) : 0.0f;
  c.sms = shape_sms();
  build_table(p, seq_first, seq_count);
  kgt = kgt && kda_chain_shape(c, st.dtype);
  size_workspace(p, stages, stages || seq_count >= 0 || !state_fold_applies(c, st.dtype), kgt);
  c.N = N, c.NT = NT;
  c.chunks = static_cast<const ChunkInfo*>(d_table);
  c.seq_chunk0 = reinterpret_cast<const int*>(static_cast<const char*>(d_table) + sizeof(ChunkInfo) * NT);
  c.grid = grid_closed_form ? grid : ChunkGrid{};
  auto f = [](const TensorView& t) { return static_cast<float*>(t.data); };
  c.gcum = f(buf.gcum), c.beta_e = f(buf.beta), c.rstd_q = f(buf.rstd_q), c.rstd_k = f(buf.rstd_k);
  c.P = f(buf.P), c.Aqk = f(buf.Aqk), c.Gk = f(buf.Gk), c.w = f(buf.w), c.u = f(buf.u), c.kg = f(buf.kg), c.qg = f(buf.qg);
  c.kg_t = f(buf.kgt), c.kg_decay = f(buf.kg_decay);
  return st;
}

StateParams Pipeline::Impl::state_params(const Setup& st, const Problem& p, const Inputs& in, const Outputs& out) const {
  StateParams sp;
  sp.c = st.c;
  sp.Vw = int(p.V);
  sp.u = st.c.u;  // gla: u = v, read by its state kernel from v
  sp.init = in.initial_state.empty() ? kInitZero : kInitGiven;
  if (!in.initial_state.empty()) sp.h0 = state_view(in.initial_state, p.flags.state_v_first, "initial_state");
  if (!out.final_state.empty()) sp.final_state = state_view(out.final_state, p.flags.state_v_first, "final_state");
  return sp;
}

Pipeline::Pipeline(Queue& queue) : impl_(std::make_unique<Impl>()) {
  KCP_CHECK(queue.device() == Device::cuda, "cuda-chunkwise: the pipeline needs a CUDA queue, got ", queue.describe());
  impl_->device = queue.device_index();
  impl_->stream = static_cast<cudaStream_t>(queue.native_stream());
  KCP_CUDA_CHECK(cudaDeviceGetAttribute(&impl_->sms, cudaDevAttrMultiProcessorCount, impl_->device));
}
Pipeline::~Pipeline() = default;

void Pipeline::forward(const Problem& p, const Inputs& in, const Outputs& out) {
  check_outputs(p, out);
  DeviceGuard guard(impl_->device);
  impl_->kept.valid = false;
  impl_->sched = {};
  if (impl_->keep_forward) return impl_->forward_kept(p, in, out);  // which uses or drops impl_->front
  impl_->front.valid = false;
  // kda with 16-bit inputs: the transposed chain where its shape rule holds (setup sets c.kg_t then;
  // the WY stage writes kg^T for it instead of kg).
  Impl::Setup st = impl_->setup(p, in, 0, -1, false, impl_->kda_chain);
  st.c.Gk = nullptr;  // kda's gram is for a backward's WY kernel: none reads this forward's (front.valid is false)
  st.c.forward_only = st.c.gla;  // gla: kkt writes each chunk's b_end row of gcum only (the chain reads no more)
  const cudaStream_t stream = impl_->stream;
  // gdn with 16-bit inputs: w and u folded into the state kernel (no WY stage).
  const bool fold = state_fold_applies(st.c, st.dtype);
  StageTimer timer(stream);
  timer.mark();
  launch_chunk_cumsum(st.c, st.dtype, stream);
  timer.mark();
  StateParams sp = impl_->state_params(st, p, in, out);
  sp.o = rows_view<OutRowsView>(out.o, "o");
  if (const Impl::WindowPlan plan = impl_->admitted_window_plan(sp); plan.chunks) {  // kda: kkt and WY beside the chain
    impl_->run_windows(sp, st.dtype, plan);
    timer.mark();
    static const char* const kWindowNames[] = {"cumsum", "kkt+wy+state+output (windows)"};
    timer.report("forward", kWindowNames);
    return;
  }
  launch_chunk_kkt(st.c, st.dtype, stream);
  timer.mark();
  if (!fold) launch_chunk_wy(st.c, st.dtype, stream);
  timer.mark();
  impl_->forward_state(sp, st.dtype, false);  // nothing reads this h after
  timer.mark();
  static const char* const kNames[] = {"cumsum", "kkt", "wy", "state+output"};
  timer.report("forward", kNames);
}

void Pipeline::set_keep_forward(bool on) {
  impl_->keep_forward = on;
  impl_->kept.valid = impl_->front.valid = false;
}

void Pipeline::set_kda_chain(bool on) { impl_->kda_chain = on; }
bool Pipeline::kda_chain_used() const { return std::string(impl_->sched.state) == "chunk_state_kda"; }
const ForwardSchedule& Pipeline::last_forward() const { return impl_->sched; }
void Pipeline::set_kda_window(int chunks) { impl_->kda_window = chunks < 0 ? -1 : chunks; }
int Pipeline::kda_windows_used() const { return impl_->sched.windows; }

std::string ForwardSchedule::describe() const {
  if (!*state) return "no state stage ran";
  std::string s = std::string("state ") + state;
  if (chain_blocks) s += " (" + std::to_string(chain_blocks) + " blocks)";
  if (fold.groups) s += " (" + fold_layout_text(fold) + ")";
  if (windows)
    s += ", " + std::to_string(windows) + " windows of " + std::to_string(window_chunks) + " chunks (kkt, WY beside the chain" +
         (chain_per_window ? ", a chain launch per window)" : ", the chain in one launch)");
  if (kept) s += front_reused ? ", kept (front stages reused)" : ", kept";
  return s;
}

void Pipeline::set_state_groups(int groups, int warpgroups) {
  KCP_CHECK(fold_layout_valid({groups, warpgroups}),
            "set_state_groups: expected 0 (automatic), 1 or 2 groups of one warpgroup, or 2 x 2; got ", groups,
            " x ", warpgroups);
  impl_->state_layout = {groups, warpgroups};
}

void Pipeline::set_chunk_grid(bool on) { impl_->grid_closed_form = on; }
bool Pipeline::chunk_grid_used() const { return impl_->grid_closed_form && impl_->grid.len > 0; }

void Pipeline::set_gla_halves(int mode) {
  KCP_CHECK(mode >= -1 && mode <= 1, "set_gla_halves: expected -1 (automatic), 0 (never) or 1 (wherever it applies), got ",
            mode);
  impl_->gla_halves_mode = mode;
}

// Automatic: each half at least 32 chunks (shorter, the output's correction outweighs the steps
// saved) and the 2 N HV (K/32)(V/32) chain blocks at most one per multiprocessor (few heads: H <= 4 at
// K = V = 128 on 132 multiprocessors). Measured on an H200 at T = 32768 (docs/BENCHMARKS.md,
// twenty-third session): H = 4 fwd+bwd 2.66 -> 2.43 ms (the forward unchanged); H = 16 (512 blocks)
// forward 1.27 -> 1.39, fwd+bwd 5.74 -> 5.92: blocks sharing a multiprocessor slow every step.
bool Pipeline::Impl::halves_apply(const ChunkParams& c, int dtype) const {
  static const int env = [] {
    const char* e = std::getenv("KCP_CUDA_GLA_HALVES");
    return e ? std::atoi(e) : -1;
  }();
  const int mode = gla_halves_mode >= 0 ? gla_halves_mode : env;
  if (mode == 0 || !c.gla || c.N != 1 || c.NT < 2 || !is_16bit(dtype) || c.V % 4) return false;
  const int64_t blocks = 2 * int64_t(c.HV) * (c.K / 32) * (c.V / 32);
  return mode > 0 || (c.NT >= 64 && blocks <= int64_t(multiprocessors(c)));
}

Pipeline::Impl::HalvesBuffers Pipeline::Impl::halves_buffers(const ChunkParams& c) {
  const size_t state = size_t(c.HV) * c.K * c.V;
  const size_t bytes = sizeof(float) * (2 * state + size_t(c.NT + 1) * c.HV * c.K);
  grow_buffer(d_halves, halves_bytes, bytes);
  return {d_halves, d_halves + state, d_halves + 2 * state};
}

bool Pipeline::Impl::gla_halves(StateParams sp, int dtype, bool store_h) {
  const ChunkParams& c = sp.c;
  if (!halves_apply(c, dtype)) return false;
  const HalvesBuffers b = halves_buffers(c);
  sp.mid = c.NT / 2, sp.mid_store_h = store_h;
  sp.s_mid = b.s_mid, sp.f_local = b.f_local, sp.decay = b.decay;
  if (!sp.h) sp.h = static_cast<float*>(buf.h.data);
  launch_gla_state_halves(sp, dtype, stream);
  return true;
}

void Pipeline::Impl::gla_dh_halves(BwdParams& bp) {
  const ChunkParams& c = bp.c;
  if (!bp.gla_dh_chain || !(bp.keep && bp.d_o.p && bp.dh && bp.dv.p) || !halves_apply(c, bp.d_o.dt)) return;
  const HalvesBuffers b = halves_buffers(c);  // the forward's (if any) are spent: its h is corrected
  bp.dh_mid = c.NT / 2, bp.dh_smid = b.s_mid, bp.dh_flocal = b.f_local, bp.dh_decay = b.decay;
}

void Pipeline::set_multiprocessors(int sms) {
  KCP_CHECK(sms >= 0, "set_multiprocessors: expected 0 (the device's count) or a positive count, got ", sms);
  impl_->sms_assumed = sms;
}

const StageBuffers& Pipeline::prepare_stages(const Problem& p, const Inputs& in) {
  DeviceGuard guard(impl_->device);
  impl_->kept.valid = impl_->front.valid = false;
  impl_->setup(p, in, 0, -1, true);
  return impl_->buf;
}

void Pipeline::run_stage(Stage s, const Problem& p, const Inputs& in, const Outputs& out) {
  DeviceGuard guard(impl_->device);
  impl_->kept.valid = impl_->front.valid = false;
  const Impl::Setup st = impl_->setup(p, in, 0, -1, true);
  const cudaStream_t stream = impl_->stream;
  switch (s) {
    case Stage::cumsum: launch_chunk_cumsum(st.c, st.dtype, stream); return;
    case Stage::kkt: launch_chunk_kkt(st.c, st.dtype, stream); return;
    case Stage::kkt_w: launch_chunk_kkt(st.c, st.dtype, stream, true); return;
    case Stage::wy: launch_chunk_wy(st.c, st.dtype, stream); return;
    case Stage::state: {
      StateParams sp = impl_->state_params(st, p, in, out);
      sp.h = static_cast<float*>(impl_->buf.h.data), sp.vnew = static_cast<float*>(impl_->buf.vnew.data);
      if (!out.o.empty()) sp.o = rows_view<OutRowsView>(out.o, "o");
      impl_->launch_state(sp, st.dtype);
      return;
    }
    case Stage::output: {
      check_outputs(p, out);
      if (st.c.gla) {  // gla: o from the stored states and v (chunk_state_gla.cu)
        StateParams sp = impl_->state_params(st, p, in, out);
        sp.h = static_cast<float*>(impl_->buf.h.data), sp.o = rows_view<OutRowsView>(out.o, "o");
        launch_gla_output(sp, st.dtype, stream);
        return;
      }
      OutputParams op;
      op.c = st.c;
      op.h = static_cast<const float*>(impl_->buf.h.data), op.vnew = static_cast<const float*>(impl_->buf.vnew.data);
      op.o = rows_view<OutRowsView>(out.o, "o");
      launch_chunk_output(op, st.dtype, stream);
      return;
    }
  }
}

void Pipeline::transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) {
  const int64_t count = check_transition_call(p, seq_begin, packed, Device::cuda, "transition_forward");
  impl_->kept.valid = impl_->front.valid = false;
  impl_->sched = {};  // its state kernel goes there too (last_forward)
  if (count == 0) return;
  DeviceGuard guard(impl_->device);
  // With keep_forward, a transition of all sequences carves the workspace as the kept forward does
  // and leaves its front stages to it (keep_front; the CP layer's order: transition, local forward).
  const bool keep = impl_->keep_forward && seq_begin == 0 && count == p.N;
  // kda with 16-bit inputs: the transposed chain where its shape rule holds (c.kg_t set, as the forward)
  const Impl::Setup st = impl_->setup(p, in, seq_begin, count, keep, impl_->kda_chain);
  StateParams sp;
  sp.c = st.c;
  sp.Vw = int(p.V + p.K), sp.Vu = int(p.V), sp.u = st.c.u, sp.init = kInitTransition;
  sp.final_state = state_view(packed, false, "transition");
  StageTimer timer(impl_->stream);
  timer.mark();
  if (state_fold_applies(st.c, st.dtype)) {  // gdn, 16-bit inputs: the forward's folded kernel (no WY stage)
    // on V + K columns: S_ext from 0 with v, M from I with v = 0; its precision is the forward's
    // (S carried as 16-bit hi + lo, TF32 P Y), checked against the oracle by test_cuda_transition.
    launch_chunk_cumsum(st.c, st.dtype, impl_->stream);
    launch_chunk_kkt(st.c, st.dtype, impl_->stream);
    if (keep) impl_->keep_front(p, in, false);  // cumsum, kkt; not WY
    timer.mark();
    const FoldLayout ran = launch_chunk_state_fold(sp, st.dtype, impl_->fold_layout(), impl_->stream);
    impl_->record_state("chunk_state_fold", sp, ran);
  } else {
    impl_->run_front(st);
    if (keep) impl_->keep_front(p, in, true, st.c.kg_t != nullptr);  // the kept forward then takes kg^T's chain
    timer.mark();
    impl_->transition_chains(sp, st.dtype, packed);
  }
  timer.mark();
  static const char* const kNames[] = {"front", "chains"};
  timer.report("transition_forward", kNames);
}

// The transition's S_ext and M chains after the front stages (kda, gla, float32 inputs).
void Pipeline::Impl::transition_chains(StateParams sp, int dtype, const TensorView& packed) {
  const ChunkParams& c = sp.c;
  if (c.kg_t) {
    // S_ext and M as the V + K columns of one launch of the transposed chain (V / 64 + K / 64 blocks per
    // sequence and value head; 64 at H = 16, K = V = 128, where chunk_state.cu's 32-column blocks are
    // 128), TF32 products as the forward's S (M too: test_cuda_transition holds it to the oracle).
    record_state(launch_state(sp, dtype), sp);  // launch_state takes that chain wherever kg_t is set
    return;
  }
  sched.state = c.gla ? "chunk_state_gla" : "chunk_state";
  if (c.gla) {  // gla's split chain for S_ext (from 0 with v); M is diagonal, the decay alone
    sp.Vw = c.V, sp.Vu = 0, sp.u = nullptr, sp.init = kInitZero;
    sp.final_state = state_view(packed.narrow(3, 0, c.V), false, "s_ext");
    launch_gla_state(sp, dtype, stream);
    sp.final_state = state_view(packed.narrow(3, c.V, c.K), false, "m");
    launch_gla_transition_m(sp, stream);
    return;
  }
  if (chunk_state_blocks(c, c.V + c.K) <= multiprocessors(c)) {
    // S_ext (from zero, with u) and M (from I, u = 0) as the V + K columns of one launch that fits on
    // the multiprocessors at once: the two chains run side by side instead of one after the other.
    // 3xTF32 for both (this path serves kda and float32 inputs, whose M keeps its 3xTF32 products;
    // S_ext only gains accuracy).
    launch_chunk_state(sp, dtype, stream, /*split=*/true);
    return;
  }
  // Else (more blocks than one wave) one launch after the other: S_ext, the state reached from zero,
  // with the forward's products; M on I with u = 0, 3xTF32.
  sp.Vw = c.V, sp.Vu = 0, sp.u = c.u, sp.init = kInitZero;
  sp.final_state = state_view(packed.narrow(3, 0, c.V), false, "s_ext");
  launch_chunk_state(sp, dtype, stream, false);
  sp.Vw = c.K, sp.u = nullptr, sp.init = kInitIdentity;
  sp.final_state = state_view(packed.narrow(3, c.V, c.K), false, "m");
  launch_chunk_state(sp, dtype, stream, /*split=*/true);
}

}  // namespace kcp::cuda
