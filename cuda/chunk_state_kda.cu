// Stage "state recurrence + output" for kda's forward with 16-bit inputs (plain, kept, and the backward's
// recompute), the state transposed:
// one warpgroup per (sequence n, value head hv, 64 value columns [v0, v0+64)) holds S^T [64, K] as the
// float32 accumulators of wgmma m64nK and feeds it back, rounded to TF32, as the register A operand of
// the next chunk's products; no product reads the state from shared memory. Per chunk c, L valid rows
// (w, u, qg from the WY stage; kg^T per chunk [K][64] and 2^(b_end) which it writes for this kernel; Aqk):
//   X^T    = S^T w_c^T                        [64,64]   A = S^T (registers), B = the w tile
//   Q^T    = S^T qg_c^T                       [64,64]   A = S^T, B = the qg tile
//   vnew^T = u_c^T - X^T                                rows >= L of w and u are zero-filled: 0 there
//   S^T    = S^T Diag(2^(b_end)) + vnew^T kg_c          A = vnew^T (registers), B = the kg^T tile
//   o^T    = scale Q^T + vnew^T Aqk_c^T                 A = vnew^T, B = the Aqk tile; rows r < L stored
// Register operands: ra_fragment puts accumulator column 8j + 2t + e at k position 8j + t + 4e
// (wgmma.cuh). A loaded tile whose rows become the N of a product fed back that way (w: chunk rows;
// kg^T: keys) stores its row l at ra_row(l), so accumulator column c holds row perm_pos(c) and the next
// product's k runs in natural order (its B tiles, w, qg, kg^T, Aqk, are read as they are).
// The same recurrence as chunk_state.cu's kda path (8 warps, 16 or 32 columns, mma.sync, S through
// shared memory), operands TF32 as there. Tiles by cp.async, 128-byte-swizzled (wgmma.cuh; the plan
// and the copies: chunk_state_kda_tiles.cuh): w, u, b_end, kg^T, Aqk double-buffered (chunk c+1's
// issued behind chunk c's first products), qg single (chunk c+1's issued once Q^T of chunk c is
// done); 227 KB in all at K = 128. One block barrier per
// chunk, after which chunk c+1's operand Sa and the decay by its b_end are formed, no wgmma in flight.
// o goes through the stage's u tile once vnew has read it and leaves in 16-byte pieces behind the next
// chunk's first products. For a backward (StateParams::h and vnew set: the kept forward, the recompute)
// the chain also stores h[c], the exact float32 S entering chunk c, one 4-byte store per element (whole
// 32-byte sectors) while chunk c's first products run (so S is decayed after them, not before), and
// vnew unrounded, formed in place of u in the u tile and written from there in 16-byte pieces.
// Without an output (the backward's recompute, the CP transition) no qg or Aqk is copied and no Q^T or
// o^T product runs. The CP transition (kInitTransition) walks V + K columns: S_ext on u's V from zero,
// M on K more from the identity with u = 0 (their u tiles zero from the start, never copied).
// In the windowed forward's one-launch mode (StateParams::ready, chunkwise_windows.cu) each thread,
// before it copies the first chunk of a window, waits (an acquire load, polled with __nanosleep) for
// the signal that window's front writes after its WY; signal_ready_kernel writes it.
// Covered by tests/cuda/test_cuda_kda_chain.cpp (against chunk_state.cu and the float64 oracle),
// test_cuda_keep.cpp (kept forward and recompute, bit for bit), test_cuda_transition.cpp (S_ext and M
// against the oracle) and, through the forward and the backward, test_cuda_forward.cpp,
// test_cuda_backward.cpp and the goldens.
#include "cuda/chunk_state_kda.cuh"

#include "cuda/chunk_state_kda_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device_math.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"
#include "cuda/wgmma.cuh"

namespace kcp::cuda {
namespace {

using namespace kda_chain;

// S^T entering the block's first chunk (accumulator column c is key perm_pos(c), row is value column
// v0 + row): the carry where an earlier window walked the sequence's chunks before, else h0 where
// given, else zero; the CP transition (kInitTransition, kTransition: no output) starts M's columns (from
// Vu) at the identity.
template <int KD, bool kTransition>
__device__ void load_initial_state(const StateParams& sp, int n, int hv, int v0, bool from_carry, float (&S)[KD / 2]) {
  const StateView& h0 = from_carry ? sp.carry : sp.h0;
  const bool given = from_carry || sp.init == kInitGiven;
  const int m0 = kTransition && sp.init == kInitTransition ? v0 - sp.Vu : -KD;  // M's column at accumulator row 0
#pragma unroll
  for (int x = 0; x < KD / 2; ++x) {
    const int key = perm_pos(wg::acc_col(x));
    S[x] = given ? load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + key * h0.si + (v0 + wg::acc_row(x)) * h0.sj)
                 : (kTransition && m0 + wg::acc_row(x) == key ? 1.0f : 0.0f);
  }
}
// The state after the block's last chunk: to the carry where a later window goes on, else final_state.
template <int KD>
__device__ void store_final_state(const StateParams& sp, int n, int hv, int v0, bool to_carry, const float (&S)[KD / 2]) {
  const StateView& f = to_carry ? sp.carry : sp.final_state;
  if (!f.p) return;
#pragma unroll
  for (int x = 0; x < KD / 2; ++x)
    store_any(f.p, f.dt, n * f.sn + hv * f.shv + perm_pos(wg::acc_col(x)) * f.si + (v0 + wg::acc_row(x)) * f.sj, S[x]);
}

// acc = S^T B^T over the K keys, B a swizzled [64][KD] tile (w or qg), one commit group.
template <int KD>
__device__ __forceinline__ void state_product(const uint32_t (&Sa)[KD / 2], uint64_t db, float (&acc)[NA]) {
#pragma unroll
  for (int j = 0; j < KD / 8; ++j) {
    uint32_t a[4];
    wg::ra_fragment(Sa, j, a);
    wg::mma_tf32_ra<BV>(acc, a, adv(db, wg::sw128_k_step(j, kChunk)), j > 0);
  }
  wg::commit();
}
// X^T = S^T w^T, then, with an output, Q^T = S^T qg^T (two commit groups, X first).
template <int KD, bool kOut>
__device__ __forceinline__ void issue_state_products(const uint32_t (&Sa)[KD / 2], uint64_t dw, uint64_t dq, float (&X)[NA],
                                                     float (&Q)[NA]) {
  wg::fence();
  state_product<KD>(Sa, dw, X);
  if constexpr (kOut) state_product<KD>(Sa, dq, Q);
}

// vnew^T = u^T - X^T as TF32 bits: accumulator column c is chunk row perm_pos(c) (w's rows at ra_row).
// kKeep: vnew itself (float32, unrounded: kernel hv rounds its own copy) in place of u in the u tile
// (each element where this thread read it; warp w's columns 16w .. 16w + 15 alone), for write_vnew.
template <bool kKeep>
__device__ __forceinline__ void form_vnew(float* us, const float (&X)[NA], uint32_t (&vn)[NA]) {
#pragma unroll
  for (int x = 0; x < NA; ++x) {
    float* e = us + perm_pos(wg::acc_col(x)) * kLdU + wg::acc_row(x);
    const float v = *e - X[x];
    vn[x] = tf32_bits(v);
    if constexpr (kKeep) *e = v;
  }
}

// vnew rows < L of warp w's 16 columns from the u tile (form_vnew<true>, after a __syncwarp) to vnew
// [TT,HV,V]: 16-byte loads and stores, a store covering 8 rows of 64 contiguous bytes. Issued while
// Q^T's products run; the warp's o overwrites these columns after its next __syncwarp.
__device__ __forceinline__ void write_vnew(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, const float* us) {
  const int lane = int(threadIdx.x & 31), c0 = 16 * int(threadIdx.x >> 5) + 4 * (lane & 3);
  float* y = sp.vnew + (int64_t(ck.t0) * sp.c.HV + hv) * sp.Vw + v0 + c0;
  const int64_t st = int64_t(sp.c.HV) * sp.Vw;
#pragma unroll
  for (int i = 0; i < kChunk / 8; ++i) {
    const int r = (lane >> 2) + 8 * i;
    if (r < ck.len) *reinterpret_cast<float4*>(y + r * st) = *reinterpret_cast<const float4*>(us + r * kLdU + c0);
  }
}

// kKeep: h[c] = S^T entering chunk c, exact (kernel hv's gate term reads h unrounded), to h [NT,HV,K,V]
// as h[c][hv][key][v0 + row]: 8 lanes of a store cover 32 contiguous bytes (whole sectors). Issued
// while chunk c's first products run (the kept chain decays S after them: decay_state).
template <int KD>
__device__ __forceinline__ void store_h(const StateParams& sp, int c, int hv, int v0, const float (&S)[KD / 2]) {
  float* h = sp.h + (int64_t(c) * sp.c.HV + hv) * KD * sp.Vw + v0;
#pragma unroll
  for (int x = 0; x < KD / 2; ++x) h[perm_pos(wg::acc_col(x)) * sp.Vw + wg::acc_row(x)] = S[x];
}

// Sa = S^T rounded to TF32: the next chunk's register operand.
template <int KD>
__device__ __forceinline__ void round_state(const float (&S)[KD / 2], uint32_t (&Sa)[KD / 2]) {
#pragma unroll
  for (int x = 0; x < KD / 2; ++x) Sa[x] = tf32_bits(S[x]);
}
// S^T Diag(2^(b_end)) in place (the update adds to the decayed state). Column 8j + 2t + e of S^T is key
// 8j + t + 4e = t + 4 m, m = 2j + e, whose factor kda_decay_pos places: four per 16-byte load, no bank
// conflicts. Run where no wgmma is in flight (ptxas would otherwise wait for them before S changes).
template <int KD>
__device__ __forceinline__ void decay_state(const float* decay, float (&S)[KD / 2]) {
  const int t = int(threadIdx.x & 3);
  const float4* f = reinterpret_cast<const float4*>(decay + t * (KD / 4));
#pragma unroll
  for (int q = 0; q < KD / 16; ++q) {  // m = 4q .. 4q + 3: j = 2q (e = 0, 1), 2q + 1 (e = 0, 1)
    const float4 d = f[(q + t) % (KD / 16)];
    const float g[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * q + (k >> 1), e = k & 1;
      S[4 * j + e] *= g[k], S[4 * j + 2 + e] *= g[k];
    }
  }
}

// S^T += vnew^T kg and, with an output, o^T = scale Q^T + vnew^T Aqk^T, both on wgmma (S^T decayed already).
template <int KD, bool kOut>
__device__ __forceinline__ void update_and_output(float scale, uint64_t dk, uint64_t da, const uint32_t (&vn)[NA],
                                                  float (&S)[KD / 2], float (&Q)[NA]) {
  if constexpr (kOut) {
#pragma unroll
    for (int x = 0; x < NA; ++x) Q[x] *= scale;
    wg::pin(Q);
  }
  wg::pin(S);
  wg::fence();
#pragma unroll
  for (int j = 0; j < kChunk / 8; ++j) {
    uint32_t a[4];
    wg::ra_fragment(vn, j, a);
    wg::mma_tf32_ra<KD>(S, a, adv(dk, wg::sw128_k_step(j, KD)), true);
    if constexpr (kOut) wg::mma_tf32_ra<BV>(Q, a, adv(da, wg::sw128_k_step(j, kChunk)), true);
  }
  wg::commit();
  wg::wait<0>();
  wg::pin(S);
  if constexpr (kOut) wg::pin(Q);
}

// o^T (accumulator row = value column v, column = chunk row r) into the free u tile of its stage as
// o [r][v] (row stride kLdU: conflict-free), for write_output after the next barrier.
__device__ __forceinline__ void stage_output(float* ot, const float (&o)[NA]) {
#pragma unroll
  for (int x = 0; x < NA; ++x) ot[wg::acc_col(x) * kLdU + wg::acc_row(x)] = o[x];
}
// o rows < L from the staged tile: each thread the 16-byte pieces that its u copies of copy_rows_async
// fill (so the next copies into the tile need no barrier after this), 4 consecutive columns per store.
__device__ __forceinline__ void write_output(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, const float* ot) {
  constexpr int segs = BV / 4, rpp = kThreads / segs;
  const int r0 = int(threadIdx.x) / segs, sg = int(threadIdx.x) % segs;
  const int64_t st = sp.o.st;
  with_element_type(sp.o.dt, [&](auto tag) {
    using To = typename decltype(tag)::type;
    To* y = static_cast<To*>(sp.o.p) + (int64_t(ck.t0) + r0) * st + int64_t(hv) * sp.o.sx + v0 + 4 * sg;
    const bool grouped = st % 4 == 0 && reinterpret_cast<uintptr_t>(y) % (4 * sizeof(To)) == 0;  // warp-uniform
#pragma unroll
    for (int i = 0; i < kChunk / rpp; ++i, y += rpp * st) {
      if (r0 + rpp * i >= ck.len) break;
      const float4 x = *reinterpret_cast<const float4*>(ot + (r0 + rpp * i) * kLdU + 4 * sg);
      if (grouped) store4(y, x.x, x.y, x.z, x.w);
      else y[0] = from_float<To>(x.x), y[1] = from_float<To>(x.y), y[2] = from_float<To>(x.z), y[3] = from_float<To>(x.w);
    }
  });
}

// Before chunk c's tiles are copied, in the windowed forward (StateParams::ready): wait until the
// fronts have signalled c's window, once per window (ready_end: the end of the windows seen ready).
// Every copying thread waits itself: no barrier is added to the step.
__device__ __forceinline__ void wait_ready(const StateParams& sp, int c, int& ready_end) {
  if (!sp.ready || c < ready_end) return;
  unsigned long long f;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(f) : "l"(sp.ready + c) : "memory");
    if (unsigned(f >> 32) == sp.epoch) break;
    __nanosleep(100);
  }
  ready_end = int(f & 0xffffffffu);
}

template <int KD, bool kKeep, bool kOut>
__global__ void __launch_bounds__(kThreads, 1) chunk_state_kda_kernel(const StateParams sp) {
  using Sm = KdaSmem<KD>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const ChainBlock b = chain_block(p, BV);
  const int v0 = b.v0, n = b.n, hv = b.hv;
  int c_begin = b.c_begin, c_end = b.c_end;
  bool from_carry = false, to_carry = false;
  if (sp.win_end > 0) {  // a window of the windowed forward (StateParams::win_begin)
    const int wb = sp.win_begin, we = sp.win_end < p.NT ? sp.win_end : p.NT + 1;  // the last window holds position NT
    if (c_begin == c_end ? (c_begin < wb || c_begin >= we) : (c_end <= wb || c_begin >= we)) return;
    from_carry = c_begin < wb, to_carry = c_end > we;
    c_begin = max(c_begin, wb), c_end = min(c_end, we);
  }
  expect_swizzle_aligned(smem_f4);
  for (int st = 0; st < 2; ++st) {  // Aqk's upper blocks: never copied; M's columns: u = 0, never copied
    if constexpr (kOut)
      for (int i = threadIdx.x; i < Sm::bytes_aqk / 16; i += kThreads)
        reinterpret_cast<float4*>(s.As(st))[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!kOut && v0 >= u_width(sp))
      for (int i = threadIdx.x; i < Sm::bytes_u / 16; i += kThreads)
        reinterpret_cast<float4*>(s.Us(st))[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  __syncthreads();  // the zeros land before any copy into the tile
  float S[KD / 2];
  load_initial_state<KD, !kOut && !kKeep>(sp, n, hv, v0, from_carry, S);
  const uint64_t dw = wg::desc(s.Ws(0), 16, 1024, true), dq = wg::desc(s.Qs(), 16, 1024, true);
  const uint64_t dk = wg::desc(s.Kt(0), 16, 1024, true), da = wg::desc(s.As(0), 16, 1024, true);
  ChunkInfo ck = c_begin < c_end ? p.chunks[c_begin] : ChunkInfo{};
  ChunkInfo next = c_begin + 1 < c_end ? p.chunks[c_begin + 1] : ck;  // the chunk table runs two ahead
  ChunkInfo prev = ck;  // the chunk whose o is staged
  uint32_t Sa[KD / 2];  // S^T entering chunk c, TF32, for its products; S then holds S^T Diag(2^(b_end))
  int ready_end = 0;
  if (c_begin < c_end) {
    wait_ready(sp, c_begin, ready_end);
    issue_tiles<KD, kOut>(sp, ck, c_begin, hv, v0, s, 0);
    if constexpr (kOut) issue_qg(p, ck, hv, s);
    cp_async_commit();
    cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
    round_state<KD>(S, Sa);
    if constexpr (!kKeep) decay_state<KD>(s.decay(0), S);  // the kept chain decays after its h store
  }
  for (int c = c_begin; c < c_end; ++c) {  // chunk c's tiles landed and visible; nothing in flight
    const int st = (c - c_begin) & 1;
    const uint64_t so = st ? uint64_t(Sm::bytes_a >> 4) : 0, sb = st ? uint64_t(Sm::bytes_b >> 4) : 0;
    const ChunkInfo after = c + 2 < c_end ? p.chunks[c + 2] : next;
    float X[NA], Q[NA];
    issue_state_products<KD, kOut>(Sa, dw + so, dq, X, Q);
    if constexpr (kKeep) store_h<KD>(sp, c, hv, v0, S);  // S is chunk c's entering state until decay_state
    if (kOut && c > c_begin) write_output(sp, prev, hv, v0, s.Us(st ^ 1));  // chunk c-1's o, staged there
    if (c + 1 < c_end) {  // into the stage chunk c-1 used
      wait_ready(sp, c + 1, ready_end);
      issue_tiles<KD, kOut>(sp, next, c + 1, hv, v0, s, st ^ 1);
    }
    wg::wait<kOut ? 1 : 0>();  // X
    wg::pin(X);
    uint32_t vn[NA];
    form_vnew<kKeep>(s.Us(st), X, vn);
    if constexpr (kKeep) {
      __syncwarp();  // the warp's vnew columns complete in the u tile
      write_vnew(sp, ck, hv, v0, s.Us(st));
    }
    wg::wait<0>();  // Q; Sa and the qg tile no longer read
    if constexpr (kOut) wg::pin(Q);
    wg::pin(Sa);
    if (kOut && c + 1 < c_end) issue_qg(p, next, hv, s);
    cp_async_commit();
    if constexpr (kKeep) decay_state<KD>(s.decay(st), S);  // chunk c's 2^(b_end), h[c] stored
    update_and_output<KD, kOut>(p.scale, dk + sb, da + sb, vn, S, Q);
    wg::pin(vn);
    if constexpr (kOut) {
      __syncwarp();  // u's columns 16w .. 16w+15 are read (form_vnew) and o's written by warp w alone
      stage_output(s.Us(st), Q);
    }
    cp_async_wait<0>();  // chunk c+1's tiles
    wg::fence_proxy_async();
    __syncthreads();  // ... visible to wgmma and every thread; chunk c's tiles read by every wgmma
    if (c + 1 < c_end) {  // no wgmma in flight: S may change
      round_state<KD>(S, Sa);
      if constexpr (!kKeep) decay_state<KD>(s.decay(st ^ 1), S);
    }
    prev = ck, ck = next, next = after;
  }
  if (kOut && c_begin < c_end) write_output(sp, prev, hv, v0, s.Us((c_end - 1 - c_begin) & 1));
  store_final_state<KD>(sp, n, hv, v0, to_carry, S);
}

template <int KD>
void launch(const StateParams& sp, cudaStream_t stream) {
  using Sm = KdaSmem<KD>;
  static_assert(Sm::bytes <= 227 * 1024, "kda chain tiles exceed shared memory");
  const dim3 grid(sp.Vw / BV, sp.c.N * sp.c.HV);
  if (sp.h && sp.o.p) launch_kernel(chunk_state_kda_kernel<KD, true, true>, grid, kThreads, Sm::bytes, stream, sp);
  else if (sp.h) launch_kernel(chunk_state_kda_kernel<KD, true, false>, grid, kThreads, Sm::bytes, stream, sp);
  else if (sp.o.p) launch_kernel(chunk_state_kda_kernel<KD, false, true>, grid, kThreads, Sm::bytes, stream, sp);
  else launch_kernel(chunk_state_kda_kernel<KD, false, false>, grid, kThreads, Sm::bytes, stream, sp);
}

// ready[c] = (epoch, c_end) for the chunks c of [c_begin, c_end): their kkt and WY are done (stream order).
__global__ void signal_ready_kernel(unsigned long long* ready, int c_begin, int c_end, unsigned epoch) {
  const int c = c_begin + int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= c_end) return;
  const unsigned long long f = (static_cast<unsigned long long>(epoch) << 32) | unsigned(c_end);
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(ready + c), "l"(f) : "memory");
}

}  // namespace

void launch_signal_ready(unsigned long long* ready, int c_begin, int c_end, unsigned epoch, cudaStream_t stream) {
  if (c_end <= c_begin) return;
  launch_kernel(signal_ready_kernel, dim3((c_end - c_begin + 127) / 128), dim3(128), 0, stream, ready, c_begin, c_end, epoch);
}

void launch_chunk_state_kda(const StateParams& sp, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  // the forward (V columns, from zero or h0), or the CP transition (kInitTransition: S_ext on the V
  // columns of u from zero and M on K more from the identity, u = 0 there; no output, h or vnew)
  const bool transition = sp.init == kInitTransition && sp.Vw == p.V + p.K && sp.Vu == p.V && !sp.o.p && !sp.h;
  KCP_CHECK(p.kda && !p.gla && (p.K == 64 || p.K == 128) && p.kg_t && p.V % BV == 0 && sp.u == p.u &&
                (transition || (sp.Vw == p.V && (sp.init == kInitZero || sp.init == kInitGiven))) &&
                !sp.h == !sp.vnew && !sp.h_tf32,
            "cuda-chunkwise: the transposed kda chain serves kda's forward (K = 64 or 128, V a multiple of 64, kg^T "
            "written by the WY stage), with h and vnew both or neither, and its CP transition (V + K columns, no output)");
  if (p.N * p.HV == 0) return;
  if (p.K == 64) launch<64>(sp, stream);
  else launch<128>(sp, stream);
}

}  // namespace kcp::cuda
