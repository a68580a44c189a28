// kda's forward (plain, and kept for a backward) in windows of chunks (Pipeline::set_kda_window). The
// transposed chain (chunk_state_kda.cu) walks each sequence's chunks with V / 64 blocks per sequence
// and value head: 32 blocks at H = 16, V = 128, so ~100 of an H200's 132 multiprocessors idle for the
// chain's 1.4 ms at T = 32768, while the kkt and WY stages before it (1.2 ms) fill the device. Here the
// chunks [0, NT) are cut into windows whose kkt and WY ("fronts") run on `side`, one window ahead of the
// chain on `chain_stream` (the device's highest priority), in one of two ways:
// - the chain in one launch (chain_in_one_launch): queued after every front, started after window 0's;
//   before copying a window's tiles its blocks wait (StateParams::ready, an acquire load per window)
//   for the signal a small kernel writes after that window's WY. No launch, first-tile wait or carry
//   per window, so windows can be short; its blocks hold their multiprocessors throughout, so the
//   fronts must be the shorter part (few blocks).
// - a chain launch per window (chain_per_window): chain w after front w, the state carried between
//   launches in float32 (StateParams::carry), front w + 1 after the event `chain_go[w]` recorded right
//   before chain w's launch (a chain block needs a whole multiprocessor, 227 KB; front w + 1's blocks,
//   queued first, would take the free ones and chain w would wait out its kkt). Between windows the
//   chain's multiprocessors serve the fronts.
// Either way each chunk's arithmetic is the unwindowed chain's: the results are its bits (the kept
// forward's h and vnew too). Why the rule in window_plan picks what it picks is measured there.
// Covered by tests/cuda/test_cuda_kda_chain.cpp (forced windows in both modes against the unwindowed
// chain, exactly, and the oracle) and tests/cuda/test_cuda_keep.cpp (the kept forward in windows).
#include <algorithm>

#include "cuda/chunkwise_impl.cuh"
#include "cuda/spinning_chains.h"

namespace kcp::cuda {

// Automatic (kda_window < 0), from the chain's blocks b on m multiprocessors (both modes measured on an
// H200, docs/BENCHMARKS.md, 34th-36th sessions):
// - 4 b <= m (H <= 16 at K = V = 128, one sequence) and NT >= 64: the chain in one launch, windows of
//   NT / 8 chunks within [32, 64]. The fronts, on the m - b other multiprocessors, keep about level with
//   the chain. H = 16: T = 4096 0.382 -> 0.352 ms (2 windows of 32), T = 8192 0.646-0.654 ->
//   0.576-0.599 (4 of 32), 16384 1.23-1.25 -> 1.05-1.07 (8 of 32), 32768 2.19-2.21 -> 2.00 (8 of 64),
//   65536 4.14-4.17 -> 3.78-3.89 (16 of 64); H = 8 T = 32768 1.90 -> 1.73-1.75. Windows of 16 lose
//   (0.64 / 2.43-2.46 at T = 8192 / 32768: each front's tail), so do 2 or 4 of 64 or 128 (0.625 / 2.07).
// - 4 b > m >= 2 b (H = 32): a chain launch per window, min(4, NT / 64) windows (the one-launch chain
//   holds its multiprocessors while the fronts, the longer part there, have the rest: H = 32 T = 32768
//   3.54 -> 4.15 ms). Per window it pays ~19 us (its launch, its first tiles, the carry) and its chain
//   runs 22-39% slower beside a front (spans, T = 32768: 4 windows 1.48 ms of chains alone, 1.79
//   beside the fronts); measured 2.60 -> 2.18-2.24 at H = 16 T = 32768 in 4 windows, 2.6-2.95 in 16.
// - else (2 b > m, or too few chunks): no windows.
// Forced (kda_window > 0): those chunks, the mode by the same 4 b <= m.
// The one-launch chain spins on the fronts' signals, so it needs the fronts to run beside all its
// blocks: only where b is below the device's real multiprocessor count (sms), whatever the tests assume,
// and where `may_spin` (admitted_window_plan: no other pipeline's chains hold the room).
Pipeline::Impl::WindowPlan Pipeline::Impl::window_plan(const StateParams& sp, bool may_spin) const {
  const ChunkParams& c = sp.c;
  if (!c.kg_t || kda_window == 0 || c.NT == 0) return {};
  const int64_t b = kda_chain_blocks(sp.Vw, c.N, c.HV), m = multiprocessors(c);
  const bool one_launch = may_spin && 4 * b <= m && b < sms;
  if (kda_window > 0) return {kda_window, one_launch};
  if (2 * b > m) return {};
  if (one_launch) return c.NT >= 64 ? WindowPlan{std::clamp(c.NT / 8, 32, 64), true} : WindowPlan{};
  if (c.NT < 128) return {};
  const int windows = std::min(4, c.NT / 64);
  return {(c.NT + windows - 1) / windows, false};
}

// window_plan, a one-launch chain only where SpinningChains admits it: this pipeline's chain and the
// other pipelines' one-launch chains in flight on the device hold at most half its multiprocessors
// (the lone chain is chosen where it holds a quarter; two such still leave the fronts half the
// device). Beyond that, a chain launch per window: slower by its launches, but it never waits on a
// kernel, so concurrent forwards cannot hold every multiprocessor spinning (spinning_chains.h).
Pipeline::Impl::WindowPlan Pipeline::Impl::admitted_window_plan(const StateParams& sp) {
  const WindowPlan plan = window_plan(sp, true);
  if (!plan.one_launch) return plan;
  const int64_t b = kda_chain_blocks(sp.Vw, sp.c.N, sp.c.HV), limit = std::min(multiprocessors(sp.c), sms) / 2;
  if (SpinningChains::process().admit(device, this, b, limit)) return plan;
  return window_plan(sp, false);
}

cudaStream_t Pipeline::Impl::chain_stream_events(size_t events) {
  if (!chain_stream) {
    int least = 0, greatest = 0;
    KCP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KCP_CUDA_CHECK(cudaStreamCreateWithPriority(&chain_stream, cudaStreamNonBlocking, greatest));
  }
  while (window_events.size() < events) {
    window_events.emplace_back();
    KCP_CUDA_CHECK(cudaEventCreateWithFlags(&window_events.back(), cudaEventDisableTiming));
  }
  return chain_stream;
}

// One window's front on `side`: kkt and WY over the chunks [c0, c1).
void Pipeline::Impl::launch_front_window(const ChunkParams& c, int c0, int c1, int dtype) {
  ChunkParams cw = c;
  cw.c_off = c0, cw.c_num = c1 - c0;
  launch_chunk_kkt(cw, dtype, side);
  launch_chunk_wy(cw, dtype, side);
}

void Pipeline::Impl::run_windows(const StateParams& sp, int dtype, WindowPlan plan) {
  const ChunkParams& c = sp.c;
  if (plan.one_launch) chain_in_one_launch(sp, dtype, plan.chunks);
  else chain_per_window(sp, dtype, plan.chunks);
  record_state("chunk_state_kda", sp);
  sched.windows = (c.NT + plan.chunks - 1) / plan.chunks, sched.window_chunks = plan.chunks;
  sched.chain_per_window = !plan.one_launch;
}

// The chain launched once, after window 0's front; it waits for window w's signal (ready[c] =
// (epoch, window end) for its chunks, set after window w's WY) before copying the window's tiles.
void Pipeline::Impl::chain_in_one_launch(StateParams sp, int dtype, int chunks) {
  const ChunkParams& c = sp.c;
  if (ready_bytes < sizeof(unsigned long long) * size_t(c.NT)) {  // zeros: no epoch (they start at 1)
    grow_buffer(d_ready, ready_bytes, sizeof(unsigned long long) * size_t(c.NT));
    KCP_CUDA_CHECK(cudaMemsetAsync(d_ready, 0, ready_bytes, stream));
    ready_epoch = 0;
  }
  if (++ready_epoch == 0) ready_epoch = 1;  // a signal of an earlier call never matches
  chain_stream_events(4);
  const cudaEvent_t front0 = window_events[0], chain_go = window_events[1], fronts_done = window_events[2],
                    chain_done = window_events[3];
  fork_side();  // side (the fronts) after the work on `stream` so far: the cumsum stage
  // Every front is queued before the chain, so that a device (or CUDA_LAUNCH_BLOCKING, or a tool) that
  // runs the kernels one after another still finishes: the chain waits on the fronts, never the reverse.
  for (int c0 = 0, w = 0; c0 < c.NT; c0 += chunks, ++w) {
    const int c1 = std::min(c.NT, c0 + chunks);
    launch_front_window(c, c0, c1, dtype);
    launch_signal_ready(d_ready, c0, c1, ready_epoch, side);
    if (w == 0) {  // the chain starts after window 0's front; front 1 once the chain is next on its stream
      KCP_CUDA_CHECK(cudaEventRecord(front0, side));
      KCP_CUDA_CHECK(cudaStreamWaitEvent(chain_stream, front0, 0));
      KCP_CUDA_CHECK(cudaEventRecord(chain_go, chain_stream));
      KCP_CUDA_CHECK(cudaStreamWaitEvent(side, chain_go, 0));
    }
  }
  sp.ready = d_ready, sp.epoch = ready_epoch;
  launch_chunk_state_kda(sp, chain_stream);
  KCP_CUDA_CHECK(cudaEventRecord(fronts_done, side));
  KCP_CUDA_CHECK(cudaEventRecord(chain_done, chain_stream));
  SpinningChains::process().launched(this,
                                     [chain_done] { return cudaEventQuery(chain_done) != cudaErrorNotReady; });
  KCP_CUDA_CHECK(cudaStreamWaitEvent(stream, fronts_done, 0));
  KCP_CUDA_CHECK(cudaStreamWaitEvent(stream, chain_done, 0));
}

// A chain launch per window, the state carried between them in float32 (StateParams::carry).
void Pipeline::Impl::chain_per_window(StateParams sp, int dtype, int chunks) {
  const ChunkParams& c = sp.c;
  const int windows = (c.NT + chunks - 1) / chunks;
  const size_t need = sizeof(float) * size_t(c.N) * c.HV * c.K * c.V;
  grow_buffer(d_carry, carry_bytes, need);  // `stream` waited for the previous call's chains
  sp.carry.p = d_carry, sp.carry.dt = kF32;
  sp.carry.sn = int64_t(c.HV) * c.K * c.V, sp.carry.shv = int64_t(c.K) * c.V, sp.carry.si = c.V, sp.carry.sj = 1;
  chain_stream_events(size_t(2 * windows + 1));
  const cudaEvent_t* front_done = window_events.data();
  const cudaEvent_t* chain_go = window_events.data() + windows;  // chain w's launch is next on its stream
  fork_side();  // side (the fronts) after the work on `stream` so far: the cumsum stage
  KCP_CUDA_CHECK(cudaStreamWaitEvent(chain_stream, fork_ev, 0));
  for (int w = 0; w < windows; ++w) {
    const int c0 = w * chunks, c1 = std::min(c.NT, c0 + chunks);
    if (w >= 1) KCP_CUDA_CHECK(cudaStreamWaitEvent(side, chain_go[w - 1], 0));  // the header says why
    launch_front_window(c, c0, c1, dtype);
    KCP_CUDA_CHECK(cudaEventRecord(front_done[w], side));
    KCP_CUDA_CHECK(cudaStreamWaitEvent(chain_stream, front_done[w], 0));
    KCP_CUDA_CHECK(cudaEventRecord(chain_go[w], chain_stream));  // chain w - 1 and front w done
    StateParams sw = sp;
    sw.win_begin = c0, sw.win_end = c1;
    launch_chunk_state_kda(sw, chain_stream);
  }
  const cudaEvent_t chains_done = window_events[2 * windows];
  KCP_CUDA_CHECK(cudaEventRecord(chains_done, chain_stream));
  KCP_CUDA_CHECK(cudaStreamWaitEvent(stream, chains_done, 0));
}

}  // namespace kcp::cuda
