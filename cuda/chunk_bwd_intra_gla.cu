// Backward stage "chunk", kernel 3 for gla where a chunk's gates allow one anchor: its last row
// (the forward's kkt takes the same anchor, chunk_kkt_gla.cuh). With every |b_r - b_end| <=
// kMaxAnchorSpread over the chunk's rows and the slab's keys (b: gate cumsum, log2 units, per key),
//   D_rs = 2^(b_r - b_s) = 2^(b_r - b_end) 2^(b_end - b_s),  qa_r = q_r 2^(b_r - b_end),  kg_s = k_s 2^(b_end - b_s),
// so the intra pairs (chunk_bwd_intra.cu's formulas, dL = 0) become two tensor-core products over
// operands built once per chunk (both within 2^+-64 of q and k):
//   dq_r = 2^(b_r - b_end) (dA kg)_r,   dk_s = 2^(b_end - b_s) (dA^T qa)_s   (dA lower triangular)
// and the gate gradient da_t = sum_{r >= t > s} dA_rs qa_r kg_s (per key, every term added, none
// subtracted: no cancellation) splits by t's 16-row block I into
//   [A] r in I, r >= t, s before I:  suffix sums of RO_r = qa_r (dA kg)^{s < 16 I}_r
//   [B] r after I, s before I:       QB, column sums of qa (dA kg)^{s < 16 I} over later row blocks
//   [C] r after I, s in I, s < t:    prefix sums of CO_s = kg_s (dA^T qa)^{r >= 16 (I + 1)}_s
//   [D] r, s in I:                   running sums in registers (a thread per block and key)
// where the partial products are the accumulators read at the 16-column block boundaries of the
// products' k loops (X by s ascending, Y by r descending). One block of 256 threads per (chunk, HV,
// NS 32-key slabs), W = 32 NS keys: warp w owns row block J = w % 4 of both products and the W / 2
// keys from (w / 4) W / 2. NS = 1: 3 blocks per multiprocessor, [D]'s rows split over the block's two
// halves. NS = 2 (KCP_CUDA_GLA_INTRA_SLABS=2; K % 64 == 0, 16-bit inputs) shares dA and the block's
// fixed work between 64 keys and each A fragment between 4 n-tiles, at 2 blocks per multiprocessor:
// measured slower (H200, T = 32768: 1.00 against 0.90 ms; docs/BENCHMARKS.md, 27th session).
// Operands in TF32 with 16-bit inputs, 3xTF32 with float32 ones (bwd_split_products), as kernel hv.
// A block whose chunk fails the test (or has a NaN gate) writes 0 to its flag in BwdParams::
// gla_intra_anchored and leaves its work to chunk_bwd_intra.cu's kernel (per 16-row block anchors or
// exact exponents), which runs after this one and skips the blocks flagged 1.
// Covered by tests/cuda/test_cuda_backward.cpp (gla's stage "chunk" and end-to-end cases; the
// excursion case takes the other kernel).
#include <cstdlib>

#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {

// NS slabs per block: W keys; leading dimensions of the gate tile (rows 16-byte aligned), of qa / kg
// (k-major B operands, t * ld + g conflict-free: 8 mod 32) and of the per-key sums (one thread per key).
template <int NS>
struct GlaShape {
  static constexpr int W = NS * kSlab, ldG = W + 4, ldB = W + 8, ldO = W + 1, NTW = W / 16;
  static constexpr bool kHalves = NS == 1;  // [D]'s rows over two halves of the block (ST exchange)
};

template <int NS>
struct GlaIntraSmem {
  using Sh = GlaShape<NS>;
  float *dA, *g, *qa, *kg, *RO, *CO, *ST, *QB;
  static constexpr int kOut = kChunk * Sh::ldO;
  static constexpr int floats = kChunk * kLdC + kChunk * Sh::ldG + 2 * kChunk * Sh::ldB + 2 * kOut + 3 * Sh::W;
  static_assert(Sh::ldG >= Sh::ldO, "ST lives in the gate tile");
  __device__ explicit GlaIntraSmem(float* s) {
    dA = s, s += kChunk * kLdC;
    g = s, s += kChunk * Sh::ldG;
    ST = g;  // the halves' exchange for [D], written after the last read of the gates
    qa = s, kg = s + kChunk * Sh::ldB, s += 2 * kChunk * Sh::ldB;
    RO = s, CO = s + kOut, QB = s + 2 * kOut;  // QB: pairs (2,1) (3,1) (3,2) x W keys
  }
};

// Loads the block's tiles and returns the one-anchor verdict (chunk_anchor_holds) over its W keys.
template <int NS>
__device__ bool load_and_check(const GlaIntraSmem<NS>& s, const BwdParams& bp, const ChunkInfo& ck, int64_t blk, int hv,
                               int d0) {
  using Sh = GlaShape<NS>;
  const ChunkParams& p = bp.c;
  const int L = ck.len;
  copy_gates_async<true>(s.g, Sh::ldG, p, ck, hv, d0, Sh::W);
  copy_rows_async(s.dA, kLdC, bp.dAc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
#pragma unroll
  for (int z = 0; z < NS; ++z)  // while the copies above are in flight
    load_qk_slabs(s.qa + z * kSlab, s.kg + z * kSlab, Sh::ldB, p, ck.t0, hv / p.G, L, d0 + z * kSlab);
  cp_async_wait_all();
  __syncthreads();
  const int c = threadIdx.x % Sh::W;
  const float be[1] = {s.g[(L - 1) * Sh::ldG + c]};
  return chunk_anchor_holds<1>(s.g, Sh::ldG, L, c, threadIdx.x / Sh::W, kBwdThreads / Sh::W, be);
}

// qa and kg in place of the raw q, k slabs (rows >= L: q = k = 0 and the gate repeats row L - 1).
// Thread: key c = tid % W (fixed, so b_end is read once), rows tid / W + (256 / W) u.
template <int NS, bool S>
__device__ void build_anchored(const GlaIntraSmem<NS>& s) {
  using Sh = GlaShape<NS>;
  const int c = threadIdx.x % Sh::W;
  const float be = s.g[(kChunk - 1) * Sh::ldG + c];  // row 63 repeats row L - 1
#pragma unroll
  for (int r = threadIdx.x / Sh::W; r < kChunk; r += kBwdThreads / Sh::W) {
    const float b = s.g[r * Sh::ldG + c];
    s.qa[r * Sh::ldB + c] *= exp2_approx<S>(b - be);
    s.kg[r * Sh::ldB + c] *= exp2_approx<S>(be - b);
  }
}

// Per-key sums over the 16 rows of a warp's accumulators weighted by w (the row's operand tile at the
// same key): lanes with g = 0 store them, two keys per n-tile.
template <int NS>
__device__ __forceinline__ void weighted_column_sums(const float (&acc)[GlaShape<NS>::NTW][4], const float* w, int m0,
                                                     int n0, float* out) {
  constexpr int ld = GlaShape<NS>::ldB;
  const int g = lane_g(), t = lane_t();
#pragma unroll
  for (int j = 0; j < GlaShape<NS>::NTW; ++j) {
    const int c = n0 + 8 * j + 2 * t;
    float x = fmaf(w[(m0 + g) * ld + c], acc[j][0], w[(m0 + g + 8) * ld + c] * acc[j][2]);
    float y = fmaf(w[(m0 + g) * ld + c + 1], acc[j][1], w[(m0 + g + 8) * ld + c + 1] * acc[j][3]);
#pragma unroll
    for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o), y += __shfl_xor_sync(0xffffffffu, y, o);
    if (g == 0) out[c] = x, out[c + 1] = y;
  }
}

// w . acc row by row into out [64][ldO] (rows m0 .. m0 + 15, the warp's keys).
template <int NS>
__device__ __forceinline__ void weighted_rows(const float (&acc)[GlaShape<NS>::NTW][4], const float* w, int m0, int n0,
                                              float* out) {
  using Sh = GlaShape<NS>;
#pragma unroll
  for (int j = 0; j < Sh::NTW; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e), c = acc_col(n0 + 8 * j, e);
      out[r * Sh::ldO + c] = w[r * Sh::ldB + c] * acc[j][e];
    }
}

// The warp's two products: ax = dA kg (rows 16 J ..), ay = dA^T qa (rows s = 16 J ..), with the
// snapshots [A] (RO), [B] (QB) and [C] (CO) taken at the block boundaries of their k loops. J is a
// template parameter so that every loop unrolls and every shared-memory offset is a constant.
template <int NS, bool S, int J>
__device__ __forceinline__ void anchored_products(const GlaIntraSmem<NS>& s, int n0, float (&ax)[GlaShape<NS>::NTW][4],
                                                  float (&ay)[GlaShape<NS>::NTW][4]) {
  using Sh = GlaShape<NS>;
  constexpr int m0 = 16 * J;
#pragma unroll
  for (int I = 0; I <= J; ++I) {  // s-blocks ascending: before block I, ax = (dA kg)^{s < 16 I}
    if (I >= 1 && I < J) weighted_column_sums<NS>(ax, s.qa, m0, n0, s.QB + (J + I - 3) * Sh::W);
    if (I == J) weighted_rows<NS>(ax, s.qa, m0, n0, s.RO);
#pragma unroll
    for (int k0 = 16 * I; k0 < 16 * I + 16; k0 += 8) {
      const FragA<S> a = ldm_a_row<S>(s.dA, kLdC, m0, k0, false);
#pragma unroll
      for (int j = 0; j < Sh::NTW; ++j)
        mma<S>(ax[j], a, load_b<S>([&](int k, int n) { return s.kg[k * Sh::ldB + n]; }, k0, n0 + 8 * j));
    }
  }
#pragma unroll
  for (int R = 3; R >= J; --R) {  // r-blocks descending: before block J, ay = (dA^T qa)^{r >= 16 (J + 1)}
    if (R == J) weighted_rows<NS>(ay, s.kg, m0, n0, s.CO);
#pragma unroll
    for (int k0 = 16 * R; k0 < 16 * R + 16; k0 += 8) {
      const FragA<S> a = load_a<S>([&](int m, int k) { return s.dA[k * kLdC + m]; }, m0, k0);
#pragma unroll
      for (int j = 0; j < Sh::NTW; ++j)
        mma<S>(ay[j], a, load_b<S>([&](int k, int n) { return s.qa[k * Sh::ldB + n]; }, k0, n0 + 8 * j));
    }
  }
}

// dq and dk of the warp's rows and keys: kernel hv's terms (dqv, dkv, read before the products) plus
// the scaled products; written in the outputs' dtypes (direct_qk) or to the workspace.
template <int NS, bool S>
__device__ void intra_dq_dk(const GlaIntraSmem<NS>& s, const BwdParams& bp, const ChunkInfo& ck, int hv, int d0) {
  using Sh = GlaShape<NS>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, w = threadIdx.x >> 5, J = w & 3, n0 = (w >> 2) * (Sh::W / 2);
  const int64_t rs = int64_t(p.HV) * p.K, o0 = (int64_t(ck.t0) * p.HV + hv) * p.K + d0 + n0;
  float ax[Sh::NTW][4], ay[Sh::NTW][4];
#pragma unroll
  for (int j = 0; j < Sh::NTW; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int64_t o = o0 + min(acc_row(16 * J, e), L - 1) * rs + acc_col(8 * j, e);  // rows >= L: not stored
      const float2 q2 = *reinterpret_cast<const float2*>(bp.dqv + o), k2 = *reinterpret_cast<const float2*>(bp.dkv + o);
      ax[j][e] = q2.x, ax[j][e + 1] = q2.y, ay[j][e] = k2.x, ay[j][e + 1] = k2.y;
    }
  build_anchored<NS, S>(s);
  __syncthreads();
  float px[Sh::NTW][4] = {}, py[Sh::NTW][4] = {};
  switch (J) {  // warp-uniform
    case 0: anchored_products<NS, S, 0>(s, n0, px, py); break;
    case 1: anchored_products<NS, S, 1>(s, n0, px, py); break;
    case 2: anchored_products<NS, S, 2>(s, n0, px, py); break;
    default: anchored_products<NS, S, 3>(s, n0, px, py);
  }
#pragma unroll
  for (int j = 0; j < Sh::NTW; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(16 * J, e), c = acc_col(n0 + 8 * j, e);
      const float d = s.g[r * Sh::ldG + c] - s.g[(kChunk - 1) * Sh::ldG + c];  // b_r - b_end (row 63 repeats L - 1)
      ax[j][e] = fmaf(exp2_approx<S>(d), px[j][e], ax[j][e]), ay[j][e] = fmaf(exp2_approx<S>(-d), py[j][e], ay[j][e]);
    }
  if (bp.direct_qk) {  // G = 1: value head hv is q/k head hv
    store_acc_rows(bp.dq.p, bp.dq.dt, row_off(bp.dq, ck.t0, hv) + d0 + n0, bp.dq.st, L, 16 * J, ax);
    store_acc_rows(bp.dk.p, bp.dk.dt, row_off(bp.dk, ck.t0, hv) + d0 + n0, bp.dk.st, L, 16 * J, ay);
  } else {
    store_acc_rows(bp.dqv, kF32, o0, rs, L, 16 * J, ax);
    store_acc_rows(bp.dkv, kF32, o0, rs, L, 16 * J, ay);
  }
}

// [D] for block m, key dl, rows u in [u0, u1) of the block: st[v] = sum_{r >= v > s} of the block's pairs.
template <int NS, int u0, int u1>
__device__ __forceinline__ void block_rectangles(const GlaIntraSmem<NS>& s, int m, int dl, float (&st)[16]) {
  constexpr int ld = GlaShape<NS>::ldB;
  const int r0 = 16 * m;
  float ke[u1 - 1];
#pragma unroll
  for (int v = 0; v < u1 - 1; ++v) ke[v] = s.kg[(r0 + v) * ld + dl];
#pragma unroll
  for (int v = 0; v < 16; ++v) st[v] = 0.0f;
#pragma unroll
  for (int u = u0; u < u1; ++u) {
    const float qr = s.qa[(r0 + u) * ld + dl];
    float run = 0.0f;  // sum_{s < v + 1} dA_rs kg_s: the pair terms of row r are qr times it
#pragma unroll
    for (int v = 0; v < u; ++v) {
      run = fmaf(s.dA[(r0 + u) * kLdC + r0 + v], ke[v], run);
      st[v + 1] = fmaf(qr, run, st[v + 1]);
    }
  }
}

// The gate gradient of block m's 16 rows at key dl (thread: m, dl, and with halves the half):
// [D] (the halves' rows 1..10 and 11..15: 55 and 65 pairs), then [C] prefix, [B], [A] suffix, and
// kernel hv's terms (da so far), written to dg (direct_dg) or da.
template <int NS>
__device__ void intra_gate(const GlaIntraSmem<NS>& s, const BwdParams& bp, const ChunkInfo& ck, int hv, int d0) {
  using Sh = GlaShape<NS>;
  const ChunkParams& p = bp.c;
  const int tid = threadIdx.x, half = Sh::kHalves ? tid >> 7 : 0, m = (tid / Sh::W) & 3, dl = tid % Sh::W;
  const int r0 = 16 * m, nr = min(16, ck.len - r0);
  const int64_t rs = int64_t(p.HV) * p.K;
  float x[16], st[16];  // x: da so far (kernel hv's terms), loaded before the rectangles
  float* da = bp.da + (int64_t(ck.t0 + r0) * p.HV + hv) * p.K + d0 + dl;  // row r0 + u at da + u * rs
  if (half == 0) {
    const float* y = da;
#pragma unroll
    for (int u = 0; u < 16; ++u, y += rs) x[u] = u < nr ? *y : 0.0f;
  }
  __syncthreads();  // RO, CO, QB complete; the gates' last reader done (ST)
  if constexpr (Sh::kHalves) {
    if (half == 0) {
      block_rectangles<NS, 1, 11>(s, m, dl, st);
    } else {
      block_rectangles<NS, 11, 16>(s, m, dl, st);
#pragma unroll
      for (int u = 0; u < 16; ++u) s.ST[(r0 + u) * Sh::ldO + dl] = st[u];
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int u = 0; u < 16; ++u) st[u] += s.ST[(r0 + u) * Sh::ldO + dl];
  } else {
    block_rectangles<NS, 1, 16>(s, m, dl, st);
  }
  if (nr <= 0) return;
  const float qm = m == 1 ? s.QB[dl] + s.QB[Sh::W + dl] : m == 2 ? s.QB[2 * Sh::W + dl] : 0.0f;
  float pre = 0.0f, suf = 0.0f;
#pragma unroll
  for (int u = 0; u < 16; ++u) st[u] += pre + qm, pre += s.CO[(r0 + u) * Sh::ldO + dl];
#pragma unroll
  for (int u = 15; u >= 0; --u) suf += s.RO[(r0 + u) * Sh::ldO + dl], st[u] += suf;
  if (bp.direct_dg) {
    with_element_type(bp.dg.dt, [&](auto tag) {  // one dtype switch, outside the row loop
      using To = typename decltype(tag)::type;
      To* y = static_cast<To*>(bp.dg.p) + row_off(bp.dg, ck.t0 + r0, hv) + d0 + dl;
#pragma unroll
      for (int u = 0; u < 16; ++u, y += bp.dg.st)
        if (u < nr) *y = from_float<To>(x[u] + st[u]);
    });
  } else {
#pragma unroll
    for (int u = 0; u < 16; ++u, da += rs)
      if (u < nr) *da = x[u] + st[u];
  }
}

// Item blockIdx.x = (chunk * HV + hv) * (K / W) + z: a chunk's slabs run together (dA shared through L2).
template <int NS, bool S>
__global__ void __launch_bounds__(kBwdThreads, NS == 1 ? 3 : 2) gla_intra_anchored_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int nz = p.K / GlaShape<NS>::W;
  const int64_t blk = blockIdx.x / nz;
  const int hv = int(blk % p.HV), d0 = (blockIdx.x % nz) * GlaShape<NS>::W;
  const ChunkInfo ck = chunk_at(p, int(blk / p.HV));
  extern __shared__ __align__(16) float smem[];
  const GlaIntraSmem<NS> s(smem);
  const bool anchored = load_and_check<NS>(s, bp, ck, blk, hv, d0);
  if (threadIdx.x < NS) bp.gla_intra_anchored[int64_t(blockIdx.x) * NS + threadIdx.x] = anchored;  // per 32-key slab
  if (!anchored) return;  // block-uniform: chunk_bwd_intra.cu's kernel does these slabs
  intra_dq_dk<NS, S>(s, bp, ck, hv, d0);
  intra_gate<NS>(s, bp, ck, hv, d0);
}

}  // namespace

// KCP_CUDA_GLA_INTRA_SLABS=2: two slabs per block where that applies (the study's form, slower).
void launch_bwd_intra_gla_anchored(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  static const bool two = [] {
    const char* e = std::getenv("KCP_CUDA_GLA_INTRA_SLABS");
    return e && std::atoi(e) == 2;
  }();
  auto run = [&](auto ns) {
    constexpr int NS = decltype(ns)::value;
    const size_t smem = sizeof(float) * GlaIntraSmem<NS>::floats;
    const dim3 grid(unsigned(int64_t(p.NT) * p.HV * (p.K / GlaShape<NS>::W)));
    dispatch_bool(bwd_split_products(bp), [&](auto split) {
      launch_kernel(gla_intra_anchored_kernel<NS, decltype(split)::value>, grid, dim3(kBwdThreads), smem, stream, bp);
    });
  };
  // float32 inputs (split products) keep one slab: two spill 76 bytes there
  if (two && p.K % 64 == 0 && !bwd_split_products(bp)) run(std::integral_constant<int, 2>{});
  else run(std::integral_constant<int, 1>{});
}

}  // namespace kcp::cuda
