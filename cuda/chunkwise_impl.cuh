// Pipeline::Impl (chunkwise.h), shared by the forward (chunkwise.cu) and the backward
// (chunkwise_backward.cu): the chunk table and float32 workspace kept on the device between calls,
// the views of the arguments as the kernels' parameter blocks, and the stage launches.
// Covered by tests/cuda/test_cuda_forward.cpp, test_cuda_stages.cpp, test_cuda_backward.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/chunkwise.h"
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_cumsum.cuh"
#include "cuda/chunk_kkt.cuh"
#include "cuda/chunk_state.cuh"
#include "cuda/chunk_state_gla.cuh"
#include "cuda/chunk_state_kda.cuh"
#include "cuda/chunk_state_fold.cuh"
#include "cuda/chunk_wy.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/env_switches.h"
#include "cuda/key_dims.h"
#include "cuda/pipeline_views.cuh"
#include "cuda/spinning_chains.h"

namespace kcp::cuda {

inline size_t round_up(size_t b) { return (b + 255) / 256 * 256; }

struct Pipeline::Impl {
  int device = 0;                // the queue's CUDA ordinal (made current by every public method)
  cudaStream_t stream = nullptr; // the queue's stream: every launch and copy goes here
  int sms = 0;                   // multiprocessors of `device`
  int sms_assumed = 0;           // set_multiprocessors (tests): the count the grid-shape choices assume; 0: sms
  // Chunk tables of the last two sequence layouts: the segmented forward (segment/) alternates
  // between its transition's range of segments and all segments, so neither is uploaded again in the
  // steady state. d_table, NT and N are those of the layout of the current call.
  struct Table {
    std::vector<int64_t> key;
    void* d = nullptr;
    size_t bytes = 0;
    int NT = 0, N = 0;
    ChunkGrid grid;
    uint64_t used = 0;  // last use, for the replacement
  };
  std::array<Table, 2> tables;
  uint64_t table_clock = 0;
  int NT = 0, N = 0;
  ChunkGrid grid;  // the current table in closed form, or len 0 (chunk_params.cuh chunk_at)
  void* d_table = nullptr;
  void* d_ws = nullptr;
  size_t ws_bytes = 0;
  StageBuffers buf;
  void* d_bws = nullptr;  // the backward's float32 workspace (chunkwise_backward.cu)
  size_t bws_bytes = 0;
  BackwardBuffers bbuf;
  FoldLayout state_layout;  // folded state kernel: a block's columns (groups 0: automatic)
  // set_state_groups where given, else KCP_CUDA_STATE_GROUPS ("1", "2", "2x2"), else automatic
  FoldLayout fold_layout() const {
    static const FoldLayout env = parse_fold_layout(std::getenv("KCP_CUDA_STATE_GROUPS"));
    return state_layout.groups ? state_layout : env;
  }
  ForwardSchedule sched;  // the last forward's (last_forward), reset by each forward
  bool kda_chain = env_not_off("KCP_CUDA_KDA_CHAIN");  // set_kda_chain
  // Whether the kept forward and the backward's recompute (which store h and vnew) take the transposed
  // kda chain (where kda_chain_shape also holds): only where its blocks fill the multiprocessors. Its
  // h and vnew stores cost ~0.55 ms per 512 chunks (2.28 ms against 1.74 without them at T = 32768,
  // H = 16), more than it gains over chunk_state.cu's chain with 4x the blocks where most
  // multiprocessors idle: kda fwd+bwd at H = 16 T = 8192 2.44 -> 2.53 ms; packed 16 x 2048 (512
  // blocks) 8.46 -> 8.14 (docs/BENCHMARKS.md, 35th session). The two chains gave the same bits in
  // test_cuda_keep (plain forward on one, kept on the other, compared bit for bit).
  bool kept_chain_transposed(const Problem& p) const {
    return kda_chain && kda_chain_blocks(int(p.V), p.N, int(p.HV)) >= shape_sms();
  }
  // The multiprocessor count the grid-shape choices assume (ChunkParams::sms): the tests' or the device's.
  int shape_sms() const { return sms_assumed > 0 ? sms_assumed : sms; }
  // kda's windowed forward (chunkwise_windows.cu; set_kda_window): -1 automatic, 0 off, > 0 chunks per
  // window; the chains' carry [N,HV,K,V] float32 and the fronts' signals [NT] (StateParams::ready),
  // grown on demand, with the epoch of the last call that signalled; the chains' stream (the device's
  // highest priority) and its events.
  int kda_window = env_window_chunks();
  float* d_carry = nullptr;
  size_t carry_bytes = 0;
  unsigned long long* d_ready = nullptr;
  size_t ready_bytes = 0;
  unsigned ready_epoch = 0;
  cudaStream_t chain_stream = nullptr;
  std::vector<cudaEvent_t> window_events;
  // How a kda forward runs in windows: chunks per window (0: unwindowed) and whether the chain is one
  // launch that waits on the fronts' signals (else a launch per window, its state carried between).
  struct WindowPlan {
    int chunks = 0;
    bool one_launch = false;
  };
  WindowPlan window_plan(const StateParams& sp, bool may_spin) const;
  WindowPlan admitted_window_plan(const StateParams& sp);  // the plan to run (spinning_chains.h)
  // kkt, WY and the transposed chain a window at a time (after the cumsum stage on `stream`; `stream`
  // waits for the chain and the fronts).
  void run_windows(const StateParams& sp, int dtype, WindowPlan plan);
  void chain_in_one_launch(StateParams sp, int dtype, int chunks);
  void chain_per_window(StateParams sp, int dtype, int chunks);
  cudaStream_t chain_stream_events(size_t events);  // the chain's stream, with at least `events` events
  void launch_front_window(const ChunkParams& c, int c0, int c1, int dtype);
  // gla's chain in halves (set_gla_halves; gla_halves): s_mid, f_local [HV,K,V] and decay [NT+1,HV,K], float32
  int gla_halves_mode = -1;
  bool grid_closed_form = env_not_off("KCP_CUDA_CHUNK_GRID");  // set_chunk_grid
  float* d_halves = nullptr;
  size_t halves_bytes = 0;
  // The kept forward (chunkwise_keep.cu; Pipeline::set_keep_forward): forward() leaves the workspace as
  // the backward's recompute would (forward_kept), and records what it was run on; a backward that
  // follows as the next call, on the same problem and on inputs of the same dtypes, shapes and
  // contents (input_fingerprint.cuh), skips the recompute (keep_matches). A transition_backward of
  // all sequences in between (the CP layer's order) skips its front stages and keeps the record;
  // any other call drops it. That transition also leaves dhu_local's chunk terms (kg, A_c, B_c: they
  // depend on the inputs and do alone, and its chains write neither dh[c] nor dvnew), as
  // backward_prepare does; the backward skips dhu_local when its do fingerprints as theirs did
  // (kept_terms_match).
  bool keep_forward = false;
  struct Kept {
    bool valid = false;
    Problem p;
    std::vector<std::pair<DType, Shape>> views;  // q, k, v, g, beta, A_log, dt_bias, initial_state
    bool terms = false;                          // dhu_local's terms in the workspace, for d_fp[2]'s do
    std::pair<DType, Shape> do_key;              // that do's dtype and shape
    // its WY wrote kg^T into kg's slot (the transposed kda chain): a backward reading the record sets up
    // with kg^T too, so that dhu_local stores kg itself (it skips the store where kg is its own buffer)
    bool kgt = false;
  } kept;
  // The front stages (gate cumsum, P, Aqk, WY) of a forward_prepare or of a transition_forward of all
  // sequences with keep_forward, for the kept forward that follows on the same problem and inputs
  // (the initial state aside: the front stages do not read it); any other call drops it.
  struct Front {
    bool valid = false;
    bool wy = false;   // WY ran (gdn's folded transition runs cumsum and kkt alone)
    bool kgt = false;  // and wrote kg^T (the transposed kda chain's) instead of kg
    Problem p;
    std::vector<std::pair<DType, Shape>> views;  // q, k, v, g, beta, A_log, dt_bias
  } front;
  // [6] fingerprints: the kept forward's inputs, the backward's; the transition's do, the backward's;
  // the front stages' inputs (q .. dt_bias), the kept forward's
  unsigned long long* d_fp = nullptr;
  int64_t kept_front_reuses = 0;  // kept forwards that skipped their front stages
  int64_t kept_reuses = 0;        // backwards (and transition_backwards) that used a kept forward
  int64_t kept_term_reuses = 0;   // backwards and transition_backwards that skipped dhu_local
  int64_t kept_redos = 0;         // backwards run again: the record was used, then the inputs fingerprinted otherwise
  bool trusted = false;  // set_inputs_unchanged: the reuse checks skip the fingerprints
  // The kept path's input fingerprints run on `side`, beside the state chains, which wait on their
  // step latency and leave most of the device idle (chunkwise_keep.cu): forked from `stream` and
  // joined to it (or, in the backward, waited for by the host) by the two events; h_fp (pinned)
  // receives the backward's pair.
  cudaStream_t side = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  unsigned long long* h_fp = nullptr;

  ~Impl() {
    for (Table& t : tables) cudaFree(t.d);  // destructor: errors cannot be reported, and the memory is gone either way
    cudaFree(d_ws);
    cudaFree(d_bws);
    cudaFree(d_fp);
    cudaFree(d_halves);
    cudaFree(d_carry);
    cudaFree(d_ready);
    if (chain_stream) {  // its one-launch chain counts in SpinningChains until it has finished
      cudaStreamSynchronize(chain_stream);
      SpinningChains::process().release(this);
      cudaStreamDestroy(chain_stream);
    }
    for (cudaEvent_t e : window_events) cudaEventDestroy(e);
    if (side) cudaStreamDestroy(side), cudaEventDestroy(fork_ev), cudaEventDestroy(join_ev), cudaFreeHost(h_fp);
  }

  // Chunk table of the sequences [first, first+count) (count < 0: all), numbered from 0 in the
  // table; uploaded when neither of the two kept tables has this layout (the least recently used one
  // is replaced: the copy is ordered on the stream after every kernel that read it).
  void build_table(const Problem& p, int64_t first, int64_t count) {
    if (count < 0) first = 0, count = p.N;
    std::vector<int64_t> key = {p.B, p.T, p.N, first, count};
    key.insert(key.end(), p.cu_seqlens.begin(), p.cu_seqlens.end());
    for (Table& t : tables)
      if (t.d && t.key == key) {
        t.used = ++table_clock, d_table = t.d, NT = t.NT, N = t.N, grid = t.grid;
        return;
      }
    Table& t = tables[0].used <= tables[1].used ? tables[0] : tables[1];
    std::vector<int64_t> starts, lens;
    for (int64_t n = first; n < first + count; ++n) {
      const SeqRange r = p.sequence(n);
      starts.push_back(r.b * p.T + r.t0), lens.push_back(r.len);
    }
    std::vector<int> seq0;
    const std::vector<ChunkInfo> chunks = chunks_of(starts, lens, seq0);
    const size_t need = sizeof(ChunkInfo) * chunks.size() + sizeof(int) * seq0.size();
    if (need > t.bytes) {
      KCP_CUDA_CHECK(cudaFree(t.d));
      t.d = nullptr, t.bytes = 0, t.key.clear();
      KCP_CUDA_CHECK(cudaMalloc(&t.d, need));
      t.bytes = need;
    }
    // From pageable memory: the copies are staged before cudaMemcpyAsync returns, so the vectors
    // may go; ordered on the stream with the kernels that read the table.
    KCP_CUDA_CHECK(cudaMemcpyAsync(t.d, chunks.data(), sizeof(ChunkInfo) * chunks.size(), cudaMemcpyHostToDevice,
                                   stream));
    KCP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(t.d) + sizeof(ChunkInfo) * chunks.size(), seq0.data(),
                                   sizeof(int) * seq0.size(), cudaMemcpyHostToDevice, stream));
    t.key = key, t.NT = int(chunks.size()), t.N = int(seq0.size()) - 1, t.used = ++table_clock;
    t.grid = closed_form(chunks);
    d_table = t.d, NT = t.NT, N = t.N, grid = t.grid;
  }

  // Carves the workspace (growing it when needed) and fills buf with views of it.
  // `wy`: w and u are needed (every path but the folded forward; never gla, whose P = I, w = 0 and
  // u = v are neither written nor read). `kgt`: kg transposed per chunk instead of kg (kda's forward
  // with the transposed chain). kg and kg^T share one slot of the larger one's bytes, and kg_decay (kg^T's
  // companion, 1/64 of its bytes) is carved for kda whichever chain runs, so that every buffer has the
  // same offset and the workspace the same size whichever of the two a call asks for: a kept forward
  // that wrote kg^T is read by a backward whose setup asks for kg, and front stages a transition left
  // (kg) are read by a kept forward that asks for kg^T (a grown workspace would have lost them).
  void size_workspace(const Problem& p, bool stages, bool wy, bool kgt = false) {
    const int64_t TT = p.B * p.T, NT64 = NT, Kg = p.per_channel_gate() ? p.K : 1;
    const bool kda = p.per_channel_gate(), l2 = p.flags.use_qk_l2norm_in_kernel;  // kda and gla: kg, qg
    const bool delta = p.variant != Variant::gla;
    wy = wy && delta;
    const Shape kg_shape{TT, p.HV, p.K}, kgt_shape{NT64, p.HV, p.K, kChunk};
    const size_t kg_slot = round_up(sizeof(float) * size_t(std::max(shape_numel(kg_shape), shape_numel(kgt_shape))));
    struct Item { TensorView* view; Shape shape; bool on; size_t slot = 0; };  // slot: bytes, where not the shape's
    const std::vector<Item> items = {
        {&buf.gcum, {TT, p.HV, Kg}, true},  {&buf.beta, {TT, p.HV}, true},
        {&buf.rstd_q, {TT, p.H}, l2},       {&buf.rstd_k, {TT, p.H}, l2},
        {&buf.P, {NT64, p.HV, kChunk, kChunk}, delta}, {&buf.Aqk, {NT64, p.HV, kChunk, kChunk}, true},
        {&buf.Gk, {NT64, p.HV, kChunk, kChunk}, delta && kda},
        {&buf.w, {TT, p.HV, p.K}, wy},      {&buf.u, {TT, p.HV, p.V}, wy},
        {kgt ? &buf.kgt : &buf.kg, kgt ? kgt_shape : kg_shape, kda, kg_slot}, {&buf.qg, {TT, p.HV, p.K}, kda},
        {&buf.h, {NT64, p.HV, p.K, p.V}, stages || !delta},  // gla: the output reads the stored states
        {&buf.vnew, {TT, p.HV, p.V}, stages},
        {&buf.kg_decay, {NT64, p.HV, p.K}, kda && delta}};  // whichever chain: the same bytes for every call
    auto bytes = [](const Item& it) { return it.slot ? it.slot : round_up(sizeof(float) * size_t(shape_numel(it.shape))); };
    size_t total = 0;
    for (const Item& it : items)
      if (it.on) total += bytes(it);
    if (total > ws_bytes) {
      KCP_CUDA_CHECK(cudaFree(d_ws));
      d_ws = nullptr;
      KCP_CUDA_CHECK(cudaMalloc(&d_ws, total));
      ws_bytes = total;
    }
    buf.kg = buf.kgt = {};
    size_t off = 0;
    for (const Item& it : items) {
      *it.view = {};
      if (!it.on) continue;
      *it.view = TensorView(static_cast<char*>(d_ws) + off, DType::f32, it.shape, Device::cuda);
      off += bytes(it);
    }
  }

  struct Setup {
    ChunkParams c;
    int dtype = kF32;
  };
  // seq_count < 0: every sequence; else the sequences [seq_first, seq_first + seq_count).
  // kgt: kg transposed per chunk for the transposed kda chain where kda_chain_shape allows it (the
  // plain forward asks; ChunkParams::kg_t is then set).
  Setup setup(const Problem& p, const Inputs& in, int64_t seq_first, int64_t seq_count, bool stages, bool kgt = false);
  StateParams state_params(const Setup& st, const Problem& p, const Inputs& in, const Outputs& out) const;
  // The forward's state stage: folded for gdn with 16-bit inputs; gla's split chain, then its output
  // from the stored states (in buf.h unless the caller keeps them elsewhere); else from w and u.
  // KCP_CUDA_STATE_GROUPS=1|2|2x2 overrides the automatic layout (diagnostics, like the stage times).
  // gla's state stage of one sequence in two halves (chunk_state_gla_halves.cu) where set_gla_halves'
  // rule applies: returns false (nothing queued) where it does not. store_h: h left true for a
  // backward (the kept forward, the backward's recompute; without an output it always is). chunkwise.cu
  bool gla_halves(StateParams sp, int dtype, bool store_h);
  // The backward's dh chain of one sequence in halves (chunk_bwd_dh_gla.cu) where the same rule applies
  // and the dv pass runs (it corrects dh): sets bp.dh_mid and the buffers, or leaves bp as it is.
  void gla_dh_halves(BwdParams& bp);
  bool halves_apply(const ChunkParams& c, int dtype) const;  // set_gla_halves' rule
  struct HalvesBuffers {
    float *s_mid, *f_local, *decay;  // [HV,K,V], [HV,K,V], [NT+1,HV,K] float32
  };
  HalvesBuffers halves_buffers(const ChunkParams& c);  // carved from d_halves, grown on demand
  // Grows the device buffer p of `bytes` to at least `need` bytes (its contents dropped), after the
  // work on `stream` so far: a previous call's kernels may still read it.
  template <class T>
  void grow_buffer(T*& p, size_t& bytes, size_t need) {
    if (need <= bytes) return;
    KCP_CUDA_CHECK(cudaStreamSynchronize(stream));
    KCP_CUDA_CHECK(cudaFree(p));
    p = nullptr, bytes = 0;
    KCP_CUDA_CHECK(cudaMalloc(&p, need));
    bytes = need;
  }
  // Returns the kernel's name (ForwardSchedule::state); `fold`, where given, gets the folded kernel's
  // layout where it ran, else {0, 0}.
  const char* launch_state(const StateParams& sp, int dtype, FoldLayout* fold = nullptr) const {
    if (fold) *fold = {0, 0};
    if (sp.c.gla) {
      StateParams g = sp;
      if (g.o.p && !g.h) g.h = static_cast<float*>(buf.h.data);
      launch_gla_state(g, dtype, stream);
      return "chunk_state_gla";
    }
    if (sp.c.kg_t) {
      launch_chunk_state_kda(sp, stream);
      return "chunk_state_kda";
    }
    if (state_fold_applies(sp.c, dtype)) {
      const FoldLayout f = launch_chunk_state_fold(sp, dtype, fold_layout(), stream);
      if (fold) *fold = f;
      return "chunk_state_fold";
    }
    launch_chunk_state(sp, dtype, stream, false);
    return "chunk_state";
  }
  // A forward's state stage (plain: store_h false; kept: true): gla's halves where they apply, else
  // launch_state; what ran goes to sched.
  void forward_state(StateParams sp, int dtype, bool store_h) {
    if (gla_halves(sp, dtype, store_h)) {
      sched.state = "chunk_state_gla_halves";
      return;
    }
    sp.h_tf32 = !store_h && sp.c.gla;  // gla's h stored for the output alone: TF32-rounded (chunk_state_gla.cu stored_h)
    FoldLayout fold;
    const char* kernel = launch_state(sp, dtype, &fold);
    record_state(kernel, sp, fold);
  }
  // sched's state kernel, with the transposed kda chain's blocks or the folded kernel's layout (as its
  // launch returned it; {0, 0}: another kernel) where they ran.
  void record_state(const char* kernel, const StateParams& sp, FoldLayout fold = {0, 0}) {
    sched.state = kernel;
    sched.chain_blocks = sp.c.kg_t ? kda_chain_blocks(sp.Vw, sp.c.N, sp.c.HV) : 0;
    sched.fold = fold;
  }
  // The backward (chunkwise_backward.cu): its workspace, and the forward recompute with h and vnew
  // plus the parameter block, for the sequences [seq_first, seq_first + seq_count) (count < 0: all).
  void size_backward_workspace(const Problem& p);
  const TensorView* backward_alias(const TensorView* b) const;  // chunkwise_backward.cu
  // keep_states: the forward states h and vnew are recomputed and kept (the chunk stage reads them);
  // the transition's state-gradient chains (dhu alone) read neither.
  // recompute = false: the workspace already holds them (a kept forward, keep_matches).
  BwdParams backward_setup(const Problem& p, const Inputs& in, int64_t seq_first, int64_t seq_count,
                           bool keep_states = true, bool recompute = true);
  // chunkwise_keep.cu
  void forward_kept(const Problem& p, const Inputs& in, const Outputs& out);
  // After front stages computed by this call on these inputs (wy: WY among them): records them.
  void keep_front(const Problem& p, const Inputs& in, bool wy, bool kgt = false);
  // transition_forward's S_ext and M chains after its front stages (all but gdn's folded kernel)
  void transition_chains(StateParams sp, int dtype, const TensorView& packed);
  // In forward_kept: whether the recorded front stages are for this problem and inputs (one host
  // synchronization); drops the record.
  bool front_matches(const Problem& p, const Inputs& in);
  // consume = false (transition_backward): the record stays for the backward that follows. With
  // `trusted`, the fingerprints are not compared.
  bool keep_matches(const Problem& p, const Inputs& in, bool consume = true);
  // The backward's use of a record without dhu_local terms: whether the problem, dtypes and shapes
  // match (host only; drops the record). The kernels then read the record at once, and the
  // fingerprint runs beside the state-gradient chain (fork_side before its launch, fingerprint_beside after);
  // speculation_held waits for it alone and says whether the inputs were the forward's.
  bool keep_speculate(const Problem& p, const Inputs& in);
  void fingerprint_beside(const Inputs& in);
  bool speculation_held();
  // `side` waits for the work queued on `stream` so far.
  void fork_side();
  // The backward after its setup: the kept record's workspace (kept), its dhu_local terms (terms),
  // the inputs' fingerprint beside the chain (speculate: keep_speculate's path). chunkwise_backward.cu
  void run_backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr, bool kept, bool terms,
                    bool speculate);
  // After dhu_local on a kept forward (transition_backward, backward_prepare): records its do.
  void keep_terms(const TensorView& d_o);
  // In a call that keep_matches: whether the terms are there for this do (one host synchronization);
  // consume: a backward, which rewrites them.
  bool kept_terms_match(const TensorView& d_o, bool consume);
  // cumsum -> kkt -> WY; with_u = false leaves u unwritten (its readers: the unfolded state kernel).
  // gdn with 16-bit inputs and no u: kkt writes w itself (ChunkParams::kkt_writes_w), no WY stage.
  void run_front(const Setup& st, bool with_u = true) const {
    const bool kkt_w = !with_u && state_fold_applies(st.c, st.dtype);
    launch_chunk_cumsum(st.c, st.dtype, stream);
    launch_chunk_kkt(st.c, st.dtype, stream, kkt_w);
    if (!kkt_w) launch_chunk_wy(st.c, st.dtype, stream, with_u);
  }
};

}  // namespace kcp::cuda
