// Backward stage "chunk", kernels 2 and 3 of 3 for gdn (scalar gate per row), fused: the WY backward
// (chunk_bwd_wy_tiles.cuh: dbeta_e, dL, and the raw gram k k^T), then the intra-chunk products through
// dA and dL (CPU twin chunk_intra_backward) and the intra part of the gate gradient, as 64x64 matrix
// products on tensor cores. dL stays in shared memory (it is M_L before its mask) and the WY stage's gram
// is the k k^T below, so neither makes a round trip through memory, and one launch less. kda and gla (a
// gate per key) run kernel wy (chunk_bwd_wy.cu), then chunk_bwd_intra.cu.
// Grid (chunks, HV), 256 threads. With D_rs = 2^(b_r - b_s) (b the chunk-local gate cumsum in log2
// units, one per row; s <= r, so every exponent <= 0), dA (kernel 1, scaled, lower with the
// diagonal) and dL of the chunk:
//   M_A[r][s] = dA_rs D_rs (s <= r),   M_L[r][s] = beta_r dL_rs D_rs (s < r)     [64,64]
//   dq += M_A k,   dk += M_L k + M_A^T q + M_L^T k                              [64,K]
//   Z  = M_A o (q k^T) + M_L o (k k^T), strictly lower (o: element-wise)        [64,64]
//   da_t (summed over the keys) = sum_{r >= t} sum_{s < t} Z_rs: a row prefix, then a column
//   suffix, sums only (no cancellation, as the CPU twin)  -> bp.part slot kPartDaIntra
// q, k are qn, kn (the fused L2 norm applied on load, chunk_bwd_tiles.cuh), streamed in passes of
// up to 64 keys (q k^T accumulates across the passes in registers); dq, dk of a pass
// added to dqv, dkv (kernel 1's parts), or, with BwdParams::direct_qk (G = 1), written to dq, dk in
// their dtypes, through the fused norm's backward where it is on (store_normed; it costs intra 0.27 ms
// at T = 32768, H = 16 for finish's 0.30, docs/BENCHMARKS.md). Products: mma.sync m16n8k8, 3xTF32 where
// bwd_split_products says so, else one TF32 product (chunk_bwd.cuh). Tiles [64][72] (8 mod 32
// words: every fragment pattern below is free of bank conflicts with scalar loads).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/chunk_bwd_wy_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdM = 72;  // [64][72] tiles: M_A, M_L, q and k passes
constexpr int kLdZ = 65;  // Z: row r read by thread r (prefix), column t by thread t (suffix)
constexpr int kPass = 64;  // keys per pass

// gs, bet [64] | MA | ML, q, k [64][kLdM] | Z [64][kLdZ] | with the fused norm's backward only
// (floats_norm): Xk [64][kLdZ], red [4][64]; Xq is Z (free until intra_gate_gdn). While the WY stage
// runs, its tiles (wy::WySmem, 74.5 KB) lie from ML on, and it reads the gates and beta from gs, bet.
struct IntraGdnSmem {
  static constexpr int kTile = kChunk * kLdM;
  static constexpr int kScalars = 2 * kChunk;
  static constexpr int kAfterMA = 3 * kTile + kChunk * kLdZ;         // ML, q, k, Z
  static constexpr int kAfterMANorm = kAfterMA + kChunk * kLdZ + 4 * kChunk;  // Xk, red
  static constexpr int wy_floats = wy::WySmem::floats;
  static constexpr int floats = kScalars + kTile + (kAfterMA > wy_floats ? kAfterMA : wy_floats);
  static constexpr int floats_norm = kScalars + kTile + (kAfterMANorm > wy_floats ? kAfterMANorm : wy_floats);
  float *gs, *bet, *MA, *ML, *q, *k, *Z, *Xq, *Xk, *red;
  __device__ explicit IntraGdnSmem(float* s)
      : gs(s), bet(s + kChunk), MA(s + kScalars), ML(MA + kTile), q(ML + kTile), k(q + kTile), Z(k + kTile), Xq(Z),
        Xk(Z + kChunk * kLdZ), red(Xk + kChunk * kLdZ) {}
  // The WY stage's view: its tiles from ML on, the gates and beta in gs, bet.
  __device__ wy::WySmem wy_view() const {
    wy::WySmem w(ML);
    w.gsc = gs, w.bet = bet;
    return w;
  }
};

// M_A, M_L in place from the raw dA, dL tiles (rows >= L and the masked parts zero).
__device__ void build_masks(const IntraGdnSmem& s, int L) {
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kBwdThreads) {
    const int r = idx / kChunk, c = idx % kChunk, o = r * kLdM + c;
    const bool in = r < L && c <= r;
    const float D = in ? exp2f(s.gs[r] - s.gs[c]) : 0.0f;
    s.MA[o] = in ? s.MA[o] * D : 0.0f;
    s.ML[o] = in && c < r ? s.bet[r] * s.ML[o] * D : 0.0f;
  }
}

// q k^T over the pass's keys (NP columns), lower 16x16 blocks only: warp w owns rows 16 (w % 4) and
// the 8-column tiles 4 (w / 4) + j (the WY stage's gram, k k^T, has the same layout). kQk: the q, k
// tiles hold TF32 values already (intra_qk_exact), so their fragments load unconverted.
template <int NP, bool S, bool kQk>
__device__ void gram_products(const IntraGdnSmem& s, float (&qk)[4][4]) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
  auto rows = [](const float* t) { return [t](int m, int k) { return t[m * kLdM + k]; }; };
#pragma unroll 2
  for (int k0 = 0; k0 < NP; k0 += 8) {
    const FragA<S> aq = load_a<S, kQk>(rows(s.q), m0, k0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (n0 + 8 * j >= m0 + 16) continue;  // the whole tile has s > r
      mma<S>(qk[j], aq, load_b<S, kQk>([&](int k, int n) { return s.k[n * kLdM + k]; }, k0, n0 + 8 * j));
    }
  }
}

// dq = M_A k and dk = M_L k + M_A^T q + M_L^T k for the pass's NP key columns: warp w owns rows
// 16 (w % 4) and the 8-column tiles (w / 4) NP/16 + j. Zero blocks of the triangles are skipped.
template <int NP, bool S, bool kQk>
__device__ void intra_products(const IntraGdnSmem& s, float (&dq)[NP / 16][4], float (&dk)[NP / 16][4]) {
  constexpr int NJ = NP / 16;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
  auto kmaj = [](const float* t) { return [t](int k, int n) { return t[k * kLdM + n]; }; };
  for (int k0 = 0; k0 < m0 + 16; k0 += 8) {  // M_A, M_L rows r < m0 + 16: columns s <= r
    const FragA<S> aA = load_a<S>([&](int m, int k) { return s.MA[m * kLdM + k]; }, m0, k0);
    const FragA<S> aL = load_a<S>([&](int m, int k) { return s.ML[m * kLdM + k]; }, m0, k0);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const FragB<S> bk = load_b<S, kQk>(kmaj(s.k), k0, n0 + 8 * j);
      mma<S>(dq[j], aA, bk);
      mma<S>(dk[j], aL, bk);
    }
  }
  for (int k0 = m0; k0 < kChunk; k0 += 8) {  // transposed: rows t >= r of M_A, M_L
    const FragA<S> aA = load_a<S>([&](int m, int k) { return s.MA[k * kLdM + m]; }, m0, k0);
    const FragA<S> aL = load_a<S>([&](int m, int k) { return s.ML[k * kLdM + m]; }, m0, k0);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      mma<S>(dk[j], aA, load_b<S, kQk>(kmaj(s.q), k0, n0 + 8 * j));
      mma<S>(dk[j], aL, load_b<S, kQk>(kmaj(s.k), k0, n0 + 8 * j));
    }
  }
}

// dq, dk += hv's parts of this pass's columns (dqv, dkv; columns d0 + ...), all loads first.
template <int NP>
__device__ void add_parts(const BwdParams& bp, const ChunkInfo& ck, int hv, int d0, float (&dq)[NP / 16][4],
                          float (&dk)[NP / 16][4]) {
  constexpr int NJ = NP / 16;
  const ChunkParams& p = bp.c;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
  float2 gq[NJ][2], gk[NJ][2];
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(acc_row(m0, 2 * h), ck.len - 1);
      const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * p.K + d0 + acc_col(n0 + 8 * j, 0);
      gq[j][h] = *reinterpret_cast<const float2*>(bp.dqv + o), gk[j][h] = *reinterpret_cast<const float2*>(bp.dkv + o);
    }
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      dq[j][2 * h] += gq[j][h].x, dq[j][2 * h + 1] += gq[j][h].y;
      dk[j][2 * h] += gk[j][h].x, dk[j][2 * h + 1] += gk[j][h].y;
    }
}

// The sums of a pass without the norm (rows < L): dq, dk in their dtypes (BwdParams::direct_qk:
// kernel intra is their last writer, finish's qk pass does not run), else back into dqv, dkv.
template <int NP>
__device__ void store_pass(const BwdParams& bp, const ChunkInfo& ck, int hv, int d0, const float (&dq)[NP / 16][4],
                           const float (&dk)[NP / 16][4]) {
  const ChunkParams& p = bp.c;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
#pragma unroll
  for (int j = 0; j < NP / 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = acc_row(m0, 2 * h), d = d0 + acc_col(n0 + 8 * j, 0);
      if (r >= ck.len) continue;
      const float2 xq = make_float2(dq[j][2 * h], dq[j][2 * h + 1]), xk = make_float2(dk[j][2 * h], dk[j][2 * h + 1]);
      if (bp.direct_qk) {  // G = 1: value head hv is q/k head hv
        store_pair(bp.dq, ck.t0 + r, hv, d, xq), store_pair(bp.dk, ck.t0 + r, hv, d, xk);
      } else {
        const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * p.K + d;
        *reinterpret_cast<float2*>(bp.dqv + o) = xq, *reinterpret_cast<float2*>(bp.dkv + o) = xk;
      }
    }
}

// f(j, e, r, c) for each accumulator element of this warp's tile in a pass of NP columns: rows from
// m0 = 16 (w % 4), columns from n0 = (w / 4) NP / 2, n-tile j, element e at row r, column c.
template <int NP, class F>
__device__ __forceinline__ void for_warp_acc(F&& f) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
#pragma unroll
  for (int j = 0; j < NP / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(j, e, acc_row(m0, e), acc_col(n0 + 8 * j, e));
}

// The fused L2 norm's backward (direct_qk with the norm: the block owns whole rows, G = 1), as
// finish's qk pass computes it: dq = rstd_q (dqn - (dqn . qn) qn), dk likewise. The row dots collect
// over the passes; the sums of the first pass (K = 2 NP) wait in Xq, Xk, the last pass's stay in
// registers. RowDots: this thread's partial dots of rows acc_row(m0, 0) and acc_row(m0, 2).
struct RowDots {
  float q[2] = {0.0f, 0.0f}, k[2] = {0.0f, 0.0f};
};
template <int NP>
__device__ void add_dots(const IntraGdnSmem& s, const float (&dq)[NP / 16][4], const float (&dk)[NP / 16][4], RowDots& rd) {
  for_warp_acc<NP>([&](int j, int e, int r, int c) {
    const int o = r * kLdM + c;
    rd.q[e >> 1] = fmaf(dq[j][e], s.q[o], rd.q[e >> 1]), rd.k[e >> 1] = fmaf(dk[j][e], s.k[o], rd.k[e >> 1]);
  });
}
template <int NP>
__device__ void keep_sums(const IntraGdnSmem& s, const float (&dq)[NP / 16][4], const float (&dk)[NP / 16][4]) {
  for_warp_acc<NP>([&](int j, int e, int r, int c) { s.Xq[r * kLdZ + c] = dq[j][e], s.Xk[r * kLdZ + c] = dk[j][e]; });
}
// Whole-row dots: over the quad (one row's 8-column pairs), then over the two warps of the row's
// column halves (w, w + 4) through s.red [q, k][half][64], in a fixed order.
__device__ void reduce_dots(const IntraGdnSmem& s, RowDots& rd) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), half = w >> 2;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1)
      rd.q[h] += __shfl_xor_sync(0xffffffffu, rd.q[h], x), rd.k[h] += __shfl_xor_sync(0xffffffffu, rd.k[h], x);
  if (lane_t() == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = acc_row(m0, 2 * h);
      s.red[half * kChunk + r] = rd.q[h], s.red[(2 + half) * kChunk + r] = rd.k[h];
    }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = acc_row(m0, 2 * h);
    rd.q[h] = s.red[r] + s.red[kChunk + r], rd.k[h] = s.red[2 * kChunk + r] + s.red[3 * kChunk + r];
  }
}
// dq, dk of one pass's columns (rows < L) from its sums x(j, e) and the pass's qn, kn tiles in s.q, s.k.
template <int NP, class XQ, class XK>
__device__ void store_normed(const BwdParams& bp, const IntraGdnSmem& s, const ChunkInfo& ck, int hv, int d0,
                             const RowDots& rd, XQ xq, XK xk) {
  const ChunkParams& p = bp.c;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = acc_row(m0, 2 * h);
    if (r >= ck.len) continue;
    const int64_t tt = ck.t0 + r;
    const float rq = p.rstd_q[tt * p.H + hv], rk = p.rstd_k[tt * p.H + hv];
#pragma unroll
    for (int j = 0; j < NP / 16; ++j) {
      const int c = acc_col(n0 + 8 * j, 0), o = r * kLdM + c;
      const float2 a = xq(j, 2 * h), b = xk(j, 2 * h);
      store_pair(bp.dq, tt, hv, d0 + c, make_float2(rq * (a.x - rd.q[h] * s.q[o]), rq * (a.y - rd.q[h] * s.q[o + 1])));
      store_pair(bp.dk, tt, hv, d0 + c, make_float2(rk * (b.x - rd.k[h] * s.k[o]), rk * (b.y - rd.k[h] * s.k[o + 1])));
    }
  }
}

// Whether this kernel forms the fused norm's backward (dq, dk its own, the norm on): the kernel's
// path and the launch's shared memory (floats_norm) both follow it.
__host__ __device__ inline bool intra_forms_norm(const BwdParams& bp) { return bp.direct_qk && bp.c.l2norm; }

// Whether the pass tiles and the WY stage's k slabs hold TF32 values (unsplit products, 16-bit q and k
// without the fused norm's rstd): then the products' q, k fragments need no conversion. The passes'
// F2FP conversions were ~6% of the kernel's instructions (ncu by source line, gdn T = 8192, 2026-12-03).
inline bool intra_qk_exact(const BwdParams& bp) {
  return !bwd_split_products(bp) && !bp.c.l2norm && is_16bit(bp.c.q.dt) && is_16bit(bp.c.k.dt);
}

// Z from the gram accumulators, then da_t = sum_{r >= t} (row prefix of Z)_r(t) -> the partial slot.
__device__ void intra_gate_gdn(const BwdParams& bp, const IntraGdnSmem& s, const ChunkInfo& ck, int hv,
                               const float (&qk)[4][4], const float (&kk)[4][4]) {
  const int L = ck.len;
  for_warp_acc<kChunk>([&](int j, int e, int r, int c) {  // the 64 x 64 gram tiles
    s.Z[r * kLdZ + c] = c < r ? s.MA[r * kLdM + c] * qk[j][e] + s.ML[r * kLdM + c] * kk[j][e] : 0.0f;
  });
  __syncthreads();
  const int t = threadIdx.x;
  if (t < L) {  // row t: exclusive prefix over s < t, in place (entries s >= t are not read)
    float run = 0.0f;
    for (int c = 0; c <= t; ++c) {
      const float z = s.Z[t * kLdZ + c];
      s.Z[t * kLdZ + c] = run;
      run += z;
    }
  }
  __syncthreads();
  if (t < L) {
    float da = 0.0f;
    for (int r = t; r < L; ++r) da += s.Z[r * kLdZ + t];
    bp.part[(int64_t(ck.t0 + t) * bp.c.HV + hv) * kPartSlots + kPartDaIntra] = da;
  }
}

// The pass's qn, kn tiles (keys d0 .. d0 + NP): every slab's loads in flight before the first store,
// one round trip per pass.
template <int NP>
__device__ void load_pass_tiles(const IntraGdnSmem& s, const ChunkParams& p, const ChunkInfo& ck, int h, int d0) {
  const bool vec = qk_rows_vec16(p);
  QkSlab x[NP / kSlab];
#pragma unroll
  for (int c = 0; c < NP; c += kSlab) x[c / kSlab].load(p, ck.t0, h, ck.len, d0 + c, true, vec);
#pragma unroll
  for (int c = 0; c < NP; c += kSlab) x[c / kSlab].store(s.q + c, s.k + c, kLdM, p, ck.t0, h, ck.len, d0 + c);
}

// dL from the WY stage's registers into ML (raw: build_masks applies beta, the decay and the mask).
__device__ void wy_to_intra(const IntraGdnSmem& s, const float (&dl)[4][4]) {
  __syncthreads();  // the WY stage's tiles are dead
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.ML[wy::nt_row(e) * kLdM + wy::nt_col(j, e)] = dl[j][e];
  __syncthreads();
}

// The intra stage's passes over the keys: dq, dk (through the fused norm's backward where this kernel
// forms it), and q k^T into qk.
template <int KD, bool kSplit, bool kQk>
__device__ void intra_passes(const BwdParams& bp, const IntraGdnSmem& s, const ChunkInfo& ck, int hv, float (&qk)[4][4]) {
  constexpr int NP = KD < kPass ? KD : kPass;
  static_assert(KD <= 2 * NP, "the fused norm's backward keeps the sums of one earlier pass (Xq, Xk)");
  const ChunkParams& p = bp.c;
  const int h = hv / p.G;
  const bool norm = intra_forms_norm(bp);  // finish's qk pass does not run
  RowDots rd;
  for (int d0 = 0; d0 < KD; d0 += NP) {
    __syncthreads();  // build_masks, or the previous pass, is done
    load_pass_tiles<NP>(s, p, ck, h, d0);
    __syncthreads();
    gram_products<NP, kSplit, kQk>(s, qk);
    float dq[NP / 16][4] = {}, dk[NP / 16][4] = {};
    intra_products<NP, kSplit, kQk>(s, dq, dk);
    add_parts<NP>(bp, ck, hv, d0, dq, dk);
    if (!norm) {
      store_pass<NP>(bp, ck, hv, d0, dq, dk);
      continue;
    }
    add_dots<NP>(s, dq, dk, rd);
    if (d0 + NP < KD) {  // the first of two passes: its sums wait for the whole-row dots
      keep_sums<NP>(s, dq, dk);
      continue;
    }
    reduce_dots(s, rd);
    auto reg = [](const float (&x)[NP / 16][4]) { return [&x](int j, int e) { return make_float2(x[j][e], x[j][e + 1]); }; };
    store_normed<NP>(bp, s, ck, hv, d0, rd, reg(dq), reg(dk));
  }
  if (norm && KD > NP) {  // the first pass's dq, dk: its qn, kn tiles loaded again
    __syncthreads();
    load_pass_tiles<NP>(s, p, ck, h, 0);
    __syncthreads();
    const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
    auto kept = [&](const float* X) {
      return [X, m0, n0](int j, int e) {
        const int o = acc_row(m0, e) * kLdZ + acc_col(n0 + 8 * j, e);
        return make_float2(X[o], X[o + 1]);
      };
    };
    store_normed<NP>(bp, s, ck, hv, 0, rd, kept(s.Xq), kept(s.Xk));
    __syncthreads();  // Xq is Z
  }
}

template <int KD, bool kSplit, bool kQk>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_wy_intra_gdn_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkInfo ck = chunk_at(bp.c, blockIdx.x);
  const int hv = blockIdx.y;
  const int64_t blk = int64_t(blockIdx.x) * bp.c.HV + hv;
  extern __shared__ __align__(16) float smem[];
  const IntraGdnSmem s(smem);
  copy_rows_async(s.MA, kLdM, bp.dAc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);  // complete after the WY stage's gram
  float qk[4][4] = {}, kk[4][4] = {};
  {
    float dl[4][4];
    wy::wy_backward<KD, false, kSplit, kQk>(bp, s.wy_view(), ck, hv, blk, kk, dl);
    wy_to_intra(s, dl);
  }
  build_masks(s, ck.len);
  intra_passes<KD, kSplit, kQk>(bp, s, ck, hv, qk);
  intra_gate_gdn(bp, s, ck, hv, qk, kk);
}

}  // namespace

void launch_bwd_intra_gdn(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  const size_t smem = sizeof(float) * (intra_forms_norm(bp) ? IntraGdnSmem::floats_norm : IntraGdnSmem::floats);
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    constexpr bool kS = decltype(split)::value;
    const dim3 grid(p.NT, p.HV);
    if (!kS && intra_qk_exact(bp)) launch_kernel(bwd_wy_intra_gdn_kernel<KD, false, true>, grid, dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_wy_intra_gdn_kernel<KD, kS, false>, grid, dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
