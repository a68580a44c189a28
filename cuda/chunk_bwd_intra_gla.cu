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
//   [D] r, s in I:                   running sums in registers (one thread per block and key, two halves)
// where the partial products are the accumulators read at the 16-column block boundaries of the
// products' k loops (X by s ascending, Y by r descending). One block of 256 threads per (chunk, HV, 32-key slab):
// warp w owns row block J = w % 4 of both products and n-tiles 16 (w / 4) + {0, 8} of the slab.
// Operands in TF32 with 16-bit inputs, 3xTF32 with float32 ones (bwd_split_products), as kernel hv.
// A block whose chunk fails the test (or has a NaN gate) writes 0 to its flag in BwdParams::
// gla_intra_anchored and leaves its work to chunk_bwd_intra.cu's kernel (per 16-row block anchors or
// exact exponents), which runs after this one and skips the blocks flagged 1.
// Covered by tests/cuda/test_cuda_backward.cpp (gla's stage "chunk" and end-to-end cases; the
// excursion case takes the other kernel).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdB = 40;  // qa, kg [64][32]: k-major B operands, t * ld + g conflict-free (8 mod 32)
constexpr int kLdO = 33;  // [64][32] per-key sums read by one thread per key

struct GlaIntraSmem {
  float *dA, *g, *qa, *kg, *RO, *CO, *ST, *QB;
  static constexpr int kOut = kChunk * kLdO;
  static constexpr int floats = kChunk * kLdC + kChunk * kLdS + 2 * kChunk * kLdB + 3 * kOut + 3 * kSlab;
  __device__ explicit GlaIntraSmem(float* s) {
    dA = s, s += kChunk * kLdC;
    g = s, s += kChunk * kLdS;
    qa = s, kg = s + kChunk * kLdB, s += 2 * kChunk * kLdB;
    RO = s, CO = s + kOut, ST = s + 2 * kOut, QB = s + 3 * kOut;  // QB: pairs (2,1) (3,1) (3,2) x 32 keys
  }
};

// The verdict for this block's slab (block-wide; NaN fails), every row < L against row L - 1.
__device__ bool slab_anchored(const float* g, int L) {
  const int c = threadIdx.x & 31;
  const float be = g[(L - 1) * kLdS + c];
  float m = 0.0f;
  bool nan = false;
  for (int r = threadIdx.x >> 5; r < L; r += kBwdThreads / 32) {
    const float x = g[r * kLdS + c] - be;
    m = fmaxf(m, fabsf(x)), nan |= x != x;
  }
  return !__syncthreads_or(nan || !(m <= kMaxAnchorSpread));
}

// qa and kg in place of the raw q, k slabs (rows >= L: q = k = 0 and the gate repeats row L - 1).
// Thread: key c = tid % 32 (fixed, so b_end is read once), rows tid / 32 + 8 u.
template <bool S>
__device__ void build_anchored(const GlaIntraSmem& s) {
  const int c = threadIdx.x & 31;
  const float be = s.g[(kChunk - 1) * kLdS + c];  // row 63 repeats row L - 1
#pragma unroll
  for (int r = threadIdx.x >> 5; r < kChunk; r += kBwdThreads / 32) {
    const float b = s.g[r * kLdS + c];
    s.qa[r * kLdB + c] *= exp2_approx<S>(b - be);
    s.kg[r * kLdB + c] *= exp2_approx<S>(be - b);
  }
}

// Per-key sums over the 16 rows of an accumulator pair (n-tiles j = 0, 1) weighted by w (the row's
// operand tile at the same key): lanes with g = 0 hold them, two keys each per n-tile.
__device__ __forceinline__ void weighted_column_sums(const float (&acc)[2][4], const float* w, int m0, int n0,
                                                     float* out) {
  const int g = lane_g(), t = lane_t();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int c = n0 + 8 * j + 2 * t;
    float x = fmaf(w[(m0 + g) * kLdB + c], acc[j][0], w[(m0 + g + 8) * kLdB + c] * acc[j][2]);
    float y = fmaf(w[(m0 + g) * kLdB + c + 1], acc[j][1], w[(m0 + g + 8) * kLdB + c + 1] * acc[j][3]);
#pragma unroll
    for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o), y += __shfl_xor_sync(0xffffffffu, y, o);
    if (g == 0) out[c] = x, out[c + 1] = y;
  }
}

// w . acc row by row into out [64][kLdO] (rows m0 .. m0 + 15, the warp's 16 keys).
__device__ __forceinline__ void weighted_rows(const float (&acc)[2][4], const float* w, int m0, int n0, float* out) {
  const int g = lane_g(), t = lane_t();
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = m0 + g + 8 * (e >> 1), c = n0 + 8 * j + 2 * t + (e & 1);
      out[r * kLdO + c] = w[r * kLdB + c] * acc[j][e];
    }
}

// The warp's two products: ax = dA kg (rows 16 J ..), ay = dA^T qa (rows s = 16 J ..), with the
// snapshots [A] (RO), [B] (QB) and [C] (CO) taken at the block boundaries of their k loops.
template <bool S>
__device__ void anchored_products(const GlaIntraSmem& s, int J, int n0, float (&ax)[2][4], float (&ay)[2][4]) {
  const int m0 = 16 * J;
  for (int I = 0; I <= J; ++I) {  // s-blocks ascending: before block I, ax = (dA kg)^{s < 16 I}
    if (I >= 1 && I < J) weighted_column_sums(ax, s.qa, m0, n0, s.QB + (J + I - 3) * kSlab);
    if (I == J) weighted_rows(ax, s.qa, m0, n0, s.RO);
#pragma unroll
    for (int k0 = 16 * I; k0 < 16 * I + 16; k0 += 8) {
      const FragA<S> a = ldm_a_row<S>(s.dA, kLdC, m0, k0, false);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        mma<S>(ax[j], a, load_b<S>([&](int k, int n) { return s.kg[k * kLdB + n]; }, k0, n0 + 8 * j));
    }
  }
  for (int R = 3; R >= J; --R) {  // r-blocks descending: before block J, ay = (dA^T qa)^{r >= 16 (J + 1)}
    if (R == J) weighted_rows(ay, s.kg, m0, n0, s.CO);
#pragma unroll
    for (int k0 = 16 * R; k0 < 16 * R + 16; k0 += 8) {
      const FragA<S> a = load_a<S>([&](int m, int k) { return s.dA[k * kLdC + m]; }, m0, k0);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        mma<S>(ay[j], a, load_b<S>([&](int k, int n) { return s.qa[k * kLdB + n]; }, k0, n0 + 8 * j));
    }
  }
}

// [D] for block m, key dl, rows u in [u0, u1) of the block: st[v] += sum_{r >= v > s} of the block's pairs.
template <int u0, int u1>
__device__ __forceinline__ void block_rectangles(const GlaIntraSmem& s, int m, int dl, float (&st)[16]) {
  const int r0 = 16 * m;
  float ke[u1 - 1];
#pragma unroll
  for (int v = 0; v < u1 - 1; ++v) ke[v] = s.kg[(r0 + v) * kLdB + dl];
#pragma unroll
  for (int v = 0; v < 16; ++v) st[v] = 0.0f;
#pragma unroll
  for (int u = u0; u < u1; ++u) {
    const float qr = s.qa[(r0 + u) * kLdB + dl];
    float run = 0.0f;
#pragma unroll
    for (int v = 0; v < u; ++v) {
      run = fmaf(s.dA[(r0 + u) * kLdC + r0 + v] * qr, ke[v], run);
      st[v + 1] += run;
    }
  }
}

template <bool S>
__global__ void __launch_bounds__(kBwdThreads, 3) gla_intra_anchored_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int K = p.K, nz = K / kSlab;
  const int64_t blk = blockIdx.x / nz;  // item blockIdx.x = (chunk * HV + hv) * nz + slab: a chunk's slabs
  const int hv = int(blk % p.HV), d0 = (blockIdx.x % nz) * kSlab;  // run together and share dA through L2
  const ChunkInfo ck = chunk_at(p, int(blk / p.HV));
  const int L = ck.len, h = hv / p.G;
  extern __shared__ __align__(16) float smem[];
  const GlaIntraSmem s(smem);
  copy_gates_async<true>(s.g, kLdS, p, ck, hv, d0, kSlab);
  copy_rows_async(s.dA, kLdC, bp.dAc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  load_qk_slabs(s.qa, s.kg, kLdB, p, ck.t0, h, L, d0);  // while the copies above are in flight
  cp_async_wait_all();
  __syncthreads();
  const bool anchored = slab_anchored(s.g, L);
  if (threadIdx.x == 0) bp.gla_intra_anchored[blockIdx.x] = anchored;
  if (!anchored) return;  // block-uniform: chunk_bwd_intra.cu's kernel does this slab
  const int w = threadIdx.x >> 5, J = w & 3, n0 = 16 * (w >> 2), g = lane_g(), t = lane_t();
  // dqv, dkv (kernel hv's terms) at the accumulators' rows and keys, read now, added after the products
  const int64_t rs = int64_t(p.HV) * K;
  float ax[2][4], ay[2][4];
  {
    const float *q0 = bp.dqv + (int64_t(ck.t0) * p.HV + hv) * K + d0 + n0 + 2 * t, *k0 = bp.dkv + (q0 - bp.dqv);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int64_t o = min(16 * J + g + 4 * e, L - 1) * rs + 8 * j;  // rows >= L: not stored
      const float2 q2 = *reinterpret_cast<const float2*>(q0 + o), k2 = *reinterpret_cast<const float2*>(k0 + o);
      ax[j][e] = q2.x, ax[j][e + 1] = q2.y, ay[j][e] = k2.x, ay[j][e + 1] = k2.y;
    }
  }
  build_anchored<S>(s);
  __syncthreads();
  float px[2][4] = {}, py[2][4] = {};
  anchored_products<S>(s, J, n0, px, py);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * J + g + 4 * (e & 2), c = n0 + 8 * j + 2 * t + (e & 1);
      const float d = s.g[r * kLdS + c] - s.g[(kChunk - 1) * kLdS + c];  // b_r - b_end (row 63 repeats L - 1)
      ax[j][e] = fmaf(exp2_approx<S>(d), px[j][e], ax[j][e]), ay[j][e] = fmaf(exp2_approx<S>(-d), py[j][e], ay[j][e]);
    }
  if (bp.direct_qk) {  // G = 1: value head hv is q/k head hv
    store_acc_rows(bp.dq.p, bp.dq.dt, row_off(bp.dq, ck.t0, hv) + d0 + n0, bp.dq.st, L, 16 * J, ax);
    store_acc_rows(bp.dk.p, bp.dk.dt, row_off(bp.dk, ck.t0, hv) + d0 + n0, bp.dk.st, L, 16 * J, ay);
  } else {
    const int64_t o = (int64_t(ck.t0) * p.HV + hv) * K + d0 + n0;
    store_acc_rows(bp.dqv, kF32, o, rs, L, 16 * J, ax);
    store_acc_rows(bp.dkv, kF32, o, rs, L, 16 * J, ay);
  }
  // The gate gradient: thread (half, block m, key dl); [D] over rows 1..10 on half 0, 11..15 on half 1
  // (55 and 65 pairs), then half 0 adds the rest for its block's 16 rows.
  const int half = threadIdx.x >> 7, m = (threadIdx.x >> 5) & 3, dl = threadIdx.x & 31, r0 = 16 * m;
  const int nr = min(16, L - r0);
  float x[16], st[16];  // x: da so far (kernel hv's terms), loaded before the rectangles
  float* da = bp.da + (int64_t(ck.t0 + r0) * p.HV + hv) * K + d0 + dl;  // row r0 + u at da + u * rs
  if (half == 0) {
    const float* y = da;
#pragma unroll
    for (int u = 0; u < 16; ++u, y += rs) x[u] = u < nr ? *y : 0.0f;
  }
  __syncthreads();  // RO, CO, QB complete
  if (half == 0) {
    block_rectangles<1, 11>(s, m, dl, st);
  } else {
    block_rectangles<11, 16>(s, m, dl, st);
#pragma unroll
    for (int u = 0; u < 16; ++u) s.ST[(r0 + u) * kLdO + dl] = st[u];
  }
  __syncthreads();
  if (half == 1 || nr <= 0) return;
  const float qm = m == 1 ? s.QB[dl] + s.QB[kSlab + dl] : m == 2 ? s.QB[2 * kSlab + dl] : 0.0f;
  float pre = 0.0f, suf = 0.0f;
#pragma unroll
  for (int u = 0; u < 16; ++u) st[u] += s.ST[(r0 + u) * kLdO + dl] + pre + qm, pre += s.CO[(r0 + u) * kLdO + dl];
#pragma unroll
  for (int u = 15; u >= 0; --u) suf += s.RO[(r0 + u) * kLdO + dl], st[u] += suf;
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

}  // namespace

void launch_bwd_intra_gla_anchored(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  const size_t smem = sizeof(float) * GlaIntraSmem::floats;
  const dim3 grid(unsigned(int64_t(p.NT) * p.HV * (p.K / kSlab)));
  dispatch_bool(bwd_split_products(bp), [&](auto split) {
    constexpr bool S = decltype(split)::value;
    launch_kernel(gla_intra_anchored_kernel<S>, grid, dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
