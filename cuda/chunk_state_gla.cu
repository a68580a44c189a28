// Stage "state recurrence" of gla (ALGORITHMS.md 3: GLA's chunked form; its output stage is
// chunk_output_gla.cu). Without the delta rule every key row i of the state evolves on its own,
//   S[i, :] <- 2^(b_end[i]) S[i, :] + sum_{r < L} kg[r, i] v[r, :]      (kg = k 2^(b_end - b), kkt stage)
// so the recurrence splits over key rows as well as state columns, and the output, which sums over
// all key rows, runs afterwards from the stored states, in parallel over the chunks:
//   chain:  one block of 2 warps per (sequence n and value head hv, 32 key rows [i0, i0+32), 32 state
//           columns [j0, j0+32)), S [32, 32] in the warps' accumulators (warp w: rows 16w..16w+15):
//           per chunk c, h[c] = S (the state entering c; [NT,HV,K,Vw] float32), S *= 2^(b_end) per
//           row, S += kg_c^T v_c on tensor cores. No tile depends on the chain, so the kg, v and b_end
//           tiles of the next kStages - 1 chunks are in flight (cp.async) while a chunk is reduced.
//           A step waits on one warp's latency (2 warps per block, about 2 blocks per multiprocessor),
//           so its addresses come from per-block bases (ChainSources) and, with 16-bit v, all its
//           fragments are loaded before its h stores. final_state after the last chunk. The CP
//           transition runs the chain alone for S_ext (from 0 with v); its M (decay only) is
//           diagonal, the per-key product of the chain's scalings (gla_transition_m_kernel), so the
//           chain always takes u = v. The backward's dh is the same chain reversed
//           (launch_gla_dh_chain): last chunk first, qg for kg, do for v, dh[c] = scale S stored
//           before chunk c's step. One sequence of 16-bit inputs (StateParams::mid,
//           chunk_state_gla_halves.cu): either chain walked as two halves at once, one from 0.
// Before (chunk_state.cu's gla instantiation: one block per 16 state columns of a head, walking the
// chain with all K rows and the output inside each step) the stage took 1.66 ms at T = 32768, H = 16
// on an H200; chain and output 0.90 ms (docs/BENCHMARKS.md, eleventh session).
// Products: TF32 with 16-bit inputs (kg arrives TF32-rounded, v is exact), 3xTF32 with float32
// inputs, as in chunk_state.cu.
// Covered by tests/cuda/test_cuda_stages.cpp (state h / ht for gla against the CPU twin; the plain
// forward's h stored as TF32 values, the kept forward's as float32),
// test_cuda_backward.cpp (the reversed chain: stage "dhu" and end to end), test_cuda_forward.cpp,
// test_cuda_transition.cpp, test_cuda_keep.cpp, test_cuda_segmented.cpp.
#include "cuda/chunk_state_gla.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {


// ---- the chain -------------------------------------------------------------------------------

constexpr int kBK = 32, kBV = 32;  // key rows and state columns of one chain block
constexpr int kChainThreads = 32 * (kBK / 16);
constexpr int kStages = 4;         // chunks of tiles in flight
constexpr int kLdK = 36;           // kg tile [64][32 + 4]: the 8-byte A loads at rows k0 + 2t hit 32 banks

// A warp's 16 keys in pairs: fragment row g is key m0 + 2g and row g + 8 is key m0 + 2g + 1, so the
// two A elements of a k position are adjacent in the kg tile (one 8-byte load); k positions t and
// t + 4 are tokens k0 + 2t and k0 + 2t + 1, the order in which ldmatrix.trans gives 16-bit v's B
// fragments. Accumulator element e of n-tile nt: key m0 + 2g + e/2, column 8 nt + 2t + e%2.
__device__ __forceinline__ int pair_key(int m0) { return m0 + 2 * lane_g(); }

template <class Tin>
struct ChainSmem {
  // v tile [64][32 + pad]: 16-bit rows 16-byte aligned (ldmatrix) and conflict-free; float rows
  // conflict-free for the scalar loads at rows k0 + 2t.
  static constexpr int ldv = sizeof(Tin) == 2 ? kBV + 8 : kBV + 4;
  static constexpr size_t bytes_kg = align16(4 * kChunk * kLdK), bytes_v = align16(sizeof(Tin) * kChunk * ldv),
                          bytes_g = align16(4 * kBK);
  static constexpr size_t bytes_stage = bytes_kg + bytes_v + bytes_g, bytes = kStages * bytes_stage;
  char* base;
  __device__ explicit ChainSmem(char* b) : base(b) {}
  __device__ float* kg(int st) const { return reinterpret_cast<float*>(base + st * bytes_stage); }
  __device__ Tin* v(int st) const { return reinterpret_cast<Tin*>(base + st * bytes_stage + bytes_kg); }
  __device__ float* bend(int st) const { return reinterpret_cast<float*>(base + st * bytes_stage + bytes_kg + bytes_v); }
};

// Where a block's tiles start in memory, at the sequence's first token (kg and gcum: keys from i0; v:
// columns from j0), so that chunk j's are one multiply away (its first token is t_first + 64 j):
// the per-step 64-bit index arithmetic from p's fields was a fifth of the chain's stall samples
// (ncu, twenty-first session).
template <class Tin>
struct ChainSources {
  const float* kg;
  const Tin* v;
  const float* gcum;
  int64_t tok_kg, tok_v;  // elements per token: kg and gcum (HV K), v (its token stride)
};
template <class Tin>
__device__ ChainSources<Tin> chain_sources(const ChunkParams& p, const SeqTokens& tok, int hv, int i0, int j0) {
  const int64_t first = (int64_t(tok.t_first) * p.HV + hv) * p.K + i0;
  return {p.kg + first, static_cast<const Tin*>(p.v.p) + row_off(p.v, tok.t_first, hv) + j0, p.gcum + first,
          int64_t(p.HV) * p.K, p.v.st};
}

// The tiles of chunk j into stage st: kg rows x keys [i0, i0+32) and v rows x columns [j0, j0+32)
// (rows >= L zero-filled; a full chunk copies without row tests), and b_end of the 32 keys (the
// gate cumsum of row L-1).
template <class Tin>
__device__ void issue_chain_tiles(const ChainSources<Tin>& src, const SeqTokens& tok, int j, int st, const ChainSmem<Tin>& s) {
  const int t = kChunk * j, L = tok.len(j);  // first token and length of chunk j, from the sequence's first
  const float* kg = src.kg + t * src.tok_kg;
  const Tin* v = src.v + t * src.tok_v;
  constexpr int kv = int(sizeof(Tin)) * kBV;
  with_full_chunk(L, [&](auto full) {
    constexpr bool kFull = decltype(full)::value;
    copy_rows_async<kChunk, 4 * kBK, kChainThreads, kFull>(s.kg(st), kLdK, L, kg, int(src.tok_kg));
    copy_rows_async<kChunk, kv, kChainThreads, kFull>(s.v(st), ChainSmem<Tin>::ldv, L, v, int(src.tok_v));
  });
  const float* last = src.gcum + (t + L - 1) * src.tok_kg;
  if (threadIdx.x < kBK / 4) cp_async16(s.bend(st) + 4 * threadIdx.x, last + 4 * threadIdx.x, true);
}

// h0 (kInitGiven) or 0 (kInitZero): launch_gla_state takes no other start. The reverse chain carries
// dh / scale (its products are qg^T do without the scale): its start is divided by it.
template <bool kReverse>
__device__ __forceinline__ float initial_element(const StateParams& sp, int n, int hv, int row, int col) {
  if (sp.init != kInitGiven) return 0.0f;
  const StateView& h0 = sp.h0;
  const float x = load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + row * h0.si + col * h0.sj);
  return kReverse ? x / sp.c.scale : x;
}

// S += kg^T v over the chunk's 64 tokens (rows >= L are zero): A pairs by 8-byte loads, B by one
// ldmatrix.trans per k step (16-bit v, exact in TF32) or scalar loads (float32 v, split products).
// 16-bit v: every k step's fragments are loaded first (load_chain_frags, before the step's h stores
// and scaling), then the products: loaded one k step at a time, each ldmatrix's latency stood in
// front of its four products (ncu, twenty-first session: the widening after each ldmatrix held a
// fifth of the stall samples).
struct ChainFrags16 {
  float2 a[kChunk / 8][2];
  uint32_t b[kChunk / 8][4];
};
template <class Tin>
__device__ __forceinline__ void load_chain_frags(const ChainSmem<Tin>& s, int st, int m0, ChainFrags16& f) {
  const float* kt = s.kg(st) + pair_key(m0);
  const int t = lane_t(), l = int(threadIdx.x & 31);
#pragma unroll
  for (int k = 0; k < kChunk / 8; ++k) {
    f.a[k][0] = *reinterpret_cast<const float2*>(kt + (8 * k + 2 * t) * kLdK);
    f.a[k][1] = *reinterpret_cast<const float2*>(kt + (8 * k + 2 * t + 1) * kLdK);
    ldsm_x4_trans(f.b[k], s.v(st) + (8 * k + (l & 7)) * ChainSmem<Tin>::ldv + 8 * (l >> 3));  // matrix j: columns 8j..
  }
}
template <class Tin>
__device__ __forceinline__ void chain_products16(const ChainFrags16& f, float (&S)[kBV / 8][4]) {
#pragma unroll
  for (int k = 0; k < kChunk / 8; ++k) {
    FragA<false> fa;  // kg arrives TF32-rounded
    fa.set_exact(0, f.a[k][0].x), fa.set_exact(1, f.a[k][0].y), fa.set_exact(2, f.a[k][1].x), fa.set_exact(3, f.a[k][1].y);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) {
      FragB<false> fb;
      fb.hi[0] = widen_lo<Tin>(f.b[k][nt]), fb.hi[1] = widen_hi<Tin>(f.b[k][nt]);
      mma(S[nt], fa, fb);
    }
  }
}
template <class Tin, bool kSplit>
__device__ void chain_products(const ChainSmem<Tin>& s, int st, int m0, float (&S)[kBV / 8][4]) {
  constexpr int ldv = ChainSmem<Tin>::ldv;
  const float* kt = s.kg(st) + pair_key(m0);
  const Tin* vt = s.v(st);
  const int t = lane_t(), g = lane_g();
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += 8) {
    const float2 x0 = *reinterpret_cast<const float2*>(kt + (k0 + 2 * t) * kLdK);
    const float2 x1 = *reinterpret_cast<const float2*>(kt + (k0 + 2 * t + 1) * kLdK);
    FragA<kSplit> fa;  // kg arrives split (or TF32-rounded)
    fa.set_exact(0, x0.x), fa.set_exact(1, x0.y), fa.set_exact(2, x1.x), fa.set_exact(3, x1.y);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) {
      FragB<kSplit> fb;
      fb.set(0, to_float(vt[(k0 + 2 * t) * ldv + 8 * nt + g])), fb.set(1, to_float(vt[(k0 + 2 * t + 1) * ldv + 8 * nt + g]));
      mma(S[nt], fa, fb);
    }
  }
}

// The chain's state as stored: S, or for the reverse chain scale S (= dh).
template <bool kReverse>
__device__ __forceinline__ float stored(const StateParams& sp, float x) {
  if constexpr (kReverse) return sp.c.scale * x;
  else return x;
}
// h[c] as stored: for the plain forward (StateParams::h_tf32) rounded to TF32 here, the only form its
// one reader, the output's products, uses, instead of by every output block that loads a tile of it
// (state+output 0.816 -> 0.775 ms at T = 32768, H = 16: docs/BENCHMARKS.md, 24th session). The chain
// carries S unrounded: only the copy in memory is rounded. Kept states (and the reverse chain's dh)
// stay float32 for the backward's gate term; the halves' later states for their correction.
template <bool kReverse>
__device__ __forceinline__ float stored_h(const StateParams& sp, float x, bool round) {
  const float y = stored<kReverse>(sp, x);
  return round ? tf32_round(y) : y;
}

// One chunk of the chain from stage st: h[c] = S (h: this thread's first element of h[c], or null),
// then S = Gamma_end S (+ kg^T v). 16-bit v: the products' fragments are read from shared memory
// first, so their latency passes under the h stores and the scaling.
template <class Tin, bool kSplit, bool kReverse>
__device__ void chain_step(const StateParams& sp, const ChainSmem<Tin>& s, int st, float* h, float (&S)[kBV / 8][4]) {
  const int m0 = 16 * int(threadIdx.x >> 5), key = pair_key(m0);  // this thread's keys: key, key + 1
  const float2 b = *reinterpret_cast<const float2*>(s.bend(st) + key);
  ChainFrags16 fr;
  if constexpr (!kSplit) load_chain_frags(s, st, m0, fr);
  if (h) {
    const bool round = !kSplit && !kReverse && sp.h_tf32;  // 16-bit inputs; never in halves (launch_gla_state)
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) {
      *reinterpret_cast<float2*>(h + 8 * nt) =
          make_float2(stored_h<kReverse>(sp, S[nt][0], round), stored_h<kReverse>(sp, S[nt][1], round));
      *reinterpret_cast<float2*>(h + sp.Vw + 8 * nt) =
          make_float2(stored_h<kReverse>(sp, S[nt][2], round), stored_h<kReverse>(sp, S[nt][3], round));
    }
  }
  const float f0 = exp2f(b.x), f1 = exp2f(b.y);
#pragma unroll
  for (int nt = 0; nt < kBV / 8; ++nt) S[nt][0] *= f0, S[nt][1] *= f0, S[nt][2] *= f1, S[nt][3] *= f1;
  if constexpr (kSplit) chain_products<Tin, kSplit>(s, st, m0, S);
  else chain_products16<Tin>(fr, S);
}

// kReverse: the backward's dh chain (launch_gla_dh_chain): chunks last to first, the tiles' kg and v
// being qg and do (the caller's ChunkParams), S = dh / scale. kHalves (sp.mid > 0; one sequence;
// three stages of tiles in flight instead of four, so that the 2 x 256 blocks at H = 16 are all
// resident, 43 KB each, five per multiprocessor, where set_gla_halves(1) forces the halves; the
// automatic rule takes them only at one block per multiprocessor, where four stages would also fit:
// not measured): blocks [0, N HV) walk the half walked first (forward
// [0, mid), reverse [mid, count)) from h0 into s_mid, blocks [N HV, 2 N HV) the other from 0 into
// f_local, writing its decay D_c on the way (both as stored: the reverse chain's scale S).
// chunk_state_gla_halves.cu.
template <class Tin, bool kSplit, bool kReverse, bool kHalves = false>
__global__ void __launch_bounds__(kChainThreads) gla_chain_kernel(const StateParams sp) {
  constexpr int kSt = kHalves ? 3 : kStages;
  extern __shared__ float4 smem_f4[];
  const ChainSmem<Tin> s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const int half = int(blockIdx.x) / (p.N * p.HV), x = int(blockIdx.x) % (p.N * p.HV);
  const int n = x / p.HV, hv = x % p.HV, i0 = kBK * blockIdx.y, j0 = kBV * blockIdx.z;
  int c_begin = p.seq_chunk0[n], count = p.seq_chunk0[n + 1] - c_begin;
  if constexpr (kHalves) {
    if ((half == 0) != kReverse) count = sp.mid;  // [0, mid)
    else c_begin += sp.mid, count -= sp.mid;      // [mid, count)
  }
  const int key = pair_key(16 * int(threadIdx.x >> 5)), col = 2 * lane_t();
  float S[kBV / 8][4];
#pragma unroll
  for (int nt = 0; nt < kBV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      S[nt][e] = kHalves && half == 1 ? 0.0f
                                      : initial_element<kReverse>(sp, n, hv, i0 + key + e / 2, j0 + 8 * nt + col + e % 2);
  const SeqTokens tok = seq_tokens(p, c_begin, count);
  const ChainSources<Tin> src = chain_sources<Tin>(p, tok, hv, i0, j0);
  // h[c] of this thread at chunk c_begin + j: h_first + j h_chunk
  float* const h_first = sp.h ? sp.h + ((int64_t(c_begin) * p.HV + hv) * p.K + i0 + key) * sp.Vw + j0 + col : nullptr;
  const int64_t h_chunk = int64_t(p.HV) * p.K * sp.Vw;
  auto walked = [&](int i) { return kReverse ? count - 1 - i : i; };  // the i-th chunk walked
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    if (i < count) issue_chain_tiles(src, tok, walked(i), i, s);
    cp_async_commit();
  }
  // The decay D_c of the half walked second (StateParams::decay) for this block's keys, by one lane per
  // key pair of the blocks of the first 32 state columns: 1 at its first chunk walked, then times each
  // walked chunk's 2^(b_end), in the chain's order; after its last chunk into row NT.
  float2 D = make_float2(1.0f, 1.0f);
  float* const d_first = kHalves && half == 1 && blockIdx.z == 0 && lane_t() == 0
                             ? sp.decay + (int64_t(c_begin) * p.HV + hv) * p.K + i0 + key : nullptr;
  const int64_t d_chunk = int64_t(p.HV) * p.K;
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kSt - 2>();
    __syncthreads();  // chunk i's tiles are visible, and every warp is done with chunk i - 1's stage
    const int ahead = i + kSt - 1;
    if (ahead < count) issue_chain_tiles(src, tok, walked(ahead), ahead % kSt, s);
    cp_async_commit();
    if (kHalves && d_first) {
      const float2 b = *reinterpret_cast<const float2*>(s.bend(i % kSt) + key);
      *reinterpret_cast<float2*>(d_first + walked(i) * d_chunk) = D;
      D.x *= exp2f(b.x), D.y *= exp2f(b.y);
    }
    chain_step<Tin, kSplit, kReverse>(sp, s, i % kSt, h_first ? h_first + walked(i) * h_chunk : nullptr, S);
  }
  if (kHalves && d_first)  // D after the half: row NT
    *reinterpret_cast<float2*>(sp.decay + (int64_t(p.NT) * p.HV + hv) * p.K + i0 + key) = D;
  if constexpr (kHalves) {  // the half's last state as stored, float32 [HV,K,V]
    float* f = (half == 0 ? sp.s_mid : sp.f_local) + (int64_t(hv) * p.K + i0 + key) * p.V + j0 + col;
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) {
      *reinterpret_cast<float2*>(f + 8 * nt) = make_float2(stored<kReverse>(sp, S[nt][0]), stored<kReverse>(sp, S[nt][1]));
      *reinterpret_cast<float2*>(f + p.V + 8 * nt) =
          make_float2(stored<kReverse>(sp, S[nt][2]), stored<kReverse>(sp, S[nt][3]));
    }
    return;
  }
  const StateView& f = sp.final_state;
  if (f.p) {
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        store_any(f.p, f.dt, n * f.sn + hv * f.shv + (i0 + key + e / 2) * f.si + (j0 + 8 * nt + col + e % 2) * f.sj,
                  stored<kReverse>(sp, S[nt][e]));
  }
}

// ---- the transition's M -----------------------------------------------------------------------

// M of a sequence is diagonal, M[i, i] = prod_c 2^(b_end[c, i]): per key the chain's scalings alone,
// without its K x K tiles (all but the diagonal ones zero) walking every chunk. One block per (sequence
// n, value head hv) of kDiagThreads: kDiagThreads / K groups of K threads, group g multiplying the
// factors of chunks g, g + groups, ... (their last rows from seq_tokens, as the chain finds its chunks:
// no table read per chunk, the gate loads independent), then the groups'
// products multiplied in order and the [K, K] block written row-major.
constexpr int kDiagThreads = 1024;

__global__ void __launch_bounds__(kDiagThreads) gla_transition_m_kernel(const StateParams sp) {
  __shared__ float part[kDiagThreads];
  const ChunkParams& p = sp.c;
  const int n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV, groups = kDiagThreads / p.K;
  const int c_begin = p.seq_chunk0[n], count = p.seq_chunk0[n + 1] - c_begin;
  const int g = int(threadIdx.x) / p.K, i = int(threadIdx.x) % p.K;
  if (g < groups) {
    const SeqTokens tok = seq_tokens(p, c_begin, count);
    float m = 1.0f;
#pragma unroll 4
    for (int c = g; c < count; c += groups) m *= exp2f(p.gcum[(int64_t(tok.last(c)) * p.HV + hv) * p.K + i]);
    part[threadIdx.x] = m;
  }
  __syncthreads();
  if (threadIdx.x < p.K) {
    float m = part[threadIdx.x];
    for (int h = 1; h < groups; ++h) m *= part[h * p.K + threadIdx.x];
    part[threadIdx.x] = m;  // only thread i reads or writes slot i of group 0 here
  }
  __syncthreads();
  const StateView& f = sp.final_state;
  for (int idx = threadIdx.x; idx < p.K * p.K; idx += kDiagThreads) {
    const int r = idx / p.K, j = idx % p.K;
    store_any(f.p, f.dt, n * f.sn + hv * f.shv + r * f.si + j * f.sj, r == j ? part[r] : 0.0f);
  }
}

}  // namespace

void launch_gla_transition_m(const StateParams& sp, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.gla && sp.final_state.p && p.K <= kDiagThreads, "gla transition M: expected gla, a final_state view, K <= ",
            kDiagThreads);
  if (p.N * p.HV > 0) launch_kernel(gla_transition_m_kernel, dim3(p.N * p.HV), kDiagThreads, 0, stream, sp);
}

namespace {

// The chain's launch, forward or reversed: one block per (sequence and value head, 32 keys, 32 state
// columns), or with sp.mid > 0 (16-bit inputs, one sequence) twice as many, the two halves at once with
// three stages of tiles (all blocks resident).
template <bool kReverse>
void launch_chain(const StateParams& sp, int input_dtype, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(sp.mid == 0 || (p.N == 1 && sp.mid < p.NT && sp.s_mid && sp.f_local && sp.decay && sp.Vw == p.V),
            "gla chain in halves: expected one sequence of more than mid = ", sp.mid, " chunks, V state columns and ",
            "the halves' buffers");
  if (p.N * p.HV == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    constexpr bool kS = kSplitProducts<Tin>;
    KCP_CHECK(!kS || sp.mid == 0, "gla chain in halves: 16-bit inputs only (float32 inputs walk one chain)");
    if constexpr (!kS)
      if (sp.mid > 0)
        return launch_kernel(gla_chain_kernel<Tin, kS, kReverse, true>, dim3(2 * p.N * p.HV, p.K / kBK, sp.Vw / kBV),
                             kChainThreads, 3 * ChainSmem<Tin>::bytes_stage, stream, sp);
    launch_kernel(gla_chain_kernel<Tin, kS, kReverse>, dim3(p.N * p.HV, p.K / kBK, sp.Vw / kBV), kChainThreads,
                  ChainSmem<Tin>::bytes, stream, sp);
  });
}

}  // namespace

void launch_gla_state(const StateParams& sp, int input_dtype, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.gla && (sp.init == kInitZero || sp.init == kInitGiven) && sp.Vw % kBV == 0 && p.K % kBK == 0,
            "gla state: expected gla, K and the state columns multiples of 32, and a zero or given start (M: "
            "launch_gla_transition_m)");
  KCP_CHECK(!sp.o.p || (sp.h && sp.Vw == p.V), "gla state: the output reads the forward's stored states");
  KCP_CHECK(!sp.h_tf32 || (sp.o.p && sp.mid == 0), "gla state: h is stored TF32-rounded only for an output of "
            "one chain (the plain forward), not in halves");
  StateParams s = sp;  // h as the chain stores it (stored_h): rounded where the inputs are 16-bit
  s.h_tf32 = sp.h_tf32 && is_16bit(input_dtype);
  launch_chain<false>(s, input_dtype, stream);
  if (s.o.p) launch_gla_output(s, input_dtype, stream);
}

void launch_gla_dh_chain(const StateParams& sp, int do_dtype, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.gla && (sp.init == kInitZero || sp.init == kInitGiven) && sp.Vw == p.V && p.V % kBV == 0 &&
                p.K % kBK == 0 && !sp.o.p,
            "gla dh chain: expected gla, K and V multiples of 32, V state columns, a zero or given start, no output");
  launch_chain<true>(sp, do_dtype, stream);
}

}  // namespace kcp::cuda
