// kda's forward (plain, and kept for a backward) in windows of chunks (Pipeline::set_kda_window). The
// transposed chain (chunk_state_kda.cu) walks each sequence's chunks with V / 64 blocks per sequence
// and value head: 32 blocks at H = 16, V = 128, so ~100 of an H200's 132 multiprocessors idle for the
// chain's 1.4 ms at T = 32768, while the kkt and WY stages before it (1.2 ms) fill the device. Here the
// chunks [0, NT) are cut into windows: window w's kkt and WY run on `side` while the chain of window
// w - 1 runs on `chain_stream`, and the chain carries each sequence's state from one window to the next
// through the carry buffer (float32, the chain's own register state: the result is the unwindowed
// chain's bit for bit; the kept forward's h and vnew too). The fronts run one window ahead: front w + 1
// beside chain w. A chain block takes a whole multiprocessor (227 KB of shared memory); a front's
// blocks, once they hold every multiprocessor, would keep chain w waiting for the front to drain (a
// block of a higher-priority stream is dispatched first only where it fits). Hence front w + 1 waits
// for the event `chain_go[w]`, recorded on the chain's stream right before chain w's launch. Measured
// (docs/BENCHMARKS.md, 35th session): with the event 2 windows of 64 chunks beat none at T = 8192
// (0.665-0.670 ms against 0.694-0.699; the 34th session's sweep without it found no such count), but
// windows of 32 chunks at T = 32768 still lose (2.65-2.95 ms against 2.2 in 4 windows): the event is
// not all that small windows lack (memory traffic beside the chain, or the fronts' tails, unmeasured).
// Covered by tests/cuda/test_cuda_kda_chain.cpp (forced windows against the unwindowed chain,
// exactly, and the oracle) and tests/cuda/test_cuda_keep.cpp (the kept forward in windows).
#include <algorithm>

#include "cuda/chunkwise_impl.cuh"

namespace kcp::cuda {

int Pipeline::Impl::window_chunks(const StateParams& sp) const {
  const ChunkParams& c = sp.c;
  if (!c.kg_t || kda_window == 0 || c.NT == 0) return 0;
  if (kda_window > 0) return kda_window;
  // Automatic: where the chain's blocks leave at least half of the multiprocessors idle, up to 4
  // windows of at least 64 chunks. Each window costs: a front on a part of the device with its tail, a
  // chain slowed by the front's memory traffic beside it. Measured on an H200 (docs/BENCHMARKS.md, 34th
  // and 35th sessions) at H = 16: T = 32768 (512 chunks) 2.60 ms unwindowed, 2.18-2.24 in 4 windows,
  // 2.24-2.44 in 8, 2.6-2.95 in 16; T = 8192 (128 chunks) 0.69-0.70 unwindowed, 0.665-0.670 in 2
  // windows of 64 (with front w + 1 gated on chain w's start; 0.70-1.0 in windows of 16 or 32).
  const int64_t blocks = kda_chain_blocks(sp.Vw, c.N, c.HV);
  const int windows = std::min(4, c.NT / 64);
  if (2 * blocks > multiprocessors(c) || windows < 2) return 0;
  return (c.NT + windows - 1) / windows;
}

void Pipeline::Impl::run_windows(StateParams sp, int dtype, int chunks) {
  const ChunkParams& c = sp.c;
  const int windows = (c.NT + chunks - 1) / chunks;
  const size_t need = sizeof(float) * size_t(c.N) * c.HV * c.K * c.V;
  grow_buffer(d_carry, carry_bytes, need);  // `stream` waited for the previous call's chains
  sp.carry.p = d_carry, sp.carry.dt = kF32;
  sp.carry.sn = int64_t(c.HV) * c.K * c.V, sp.carry.shv = int64_t(c.K) * c.V, sp.carry.si = c.V, sp.carry.sj = 1;
  if (!chain_stream) {
    int least = 0, greatest = 0;
    KCP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KCP_CUDA_CHECK(cudaStreamCreateWithPriority(&chain_stream, cudaStreamNonBlocking, greatest));
  }
  while (window_events.size() < size_t(2 * windows + 1)) {
    window_events.emplace_back();
    KCP_CUDA_CHECK(cudaEventCreateWithFlags(&window_events.back(), cudaEventDisableTiming));
  }
  const cudaEvent_t* front_done = window_events.data();
  const cudaEvent_t* chain_go = window_events.data() + windows;  // chain w's launch is next on its stream
  fork_side();  // side (the fronts) after the work on `stream` so far: the cumsum stage
  KCP_CUDA_CHECK(cudaStreamWaitEvent(chain_stream, fork_ev, 0));
  for (int w = 0; w < windows; ++w) {
    const int c0 = w * chunks, c1 = std::min(c.NT, c0 + chunks);
    if (w >= 1) KCP_CUDA_CHECK(cudaStreamWaitEvent(side, chain_go[w - 1], 0));  // the header says why
    ChunkParams cw = c;
    cw.c_off = c0, cw.c_num = c1 - c0;
    launch_chunk_kkt(cw, dtype, side);
    launch_chunk_wy(cw, dtype, side);
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
  sched.state = "chunk_state_kda", sched.chain_blocks = kda_chain_blocks(sp.Vw, c.N, c.HV);
  sched.windows = windows, sched.window_chunks = chunks;
}

}  // namespace kcp::cuda
