// Backward stage "chunk", kernel 3 of 3 for gdn (scalar gate per row): the intra-chunk products
// through dA and dL (CPU twin chunk_intra_backward) and the intra part of the gate gradient, as
// 64x64 matrix products on tensor cores. kda and gla (a gate per key) run chunk_bwd_intra.cu.
// Grid (chunks, HV), 256 threads. With D_rs = 2^(b_r - b_s) (b the chunk-local gate cumsum in log2
// units, one per row; s <= r, so every exponent <= 0), dA (kernel 1, scaled, lower with the
// diagonal) and dL (kernel 2) of the chunk:
//   M_A[r][s] = dA_rs D_rs (s <= r),   M_L[r][s] = beta_r dL_rs D_rs (s < r)     [64,64]
//   dq += M_A k,   dk += M_L k + M_A^T q + M_L^T k                              [64,K]
//   Z  = M_A o (q k^T) + M_L o (k k^T), strictly lower (o: element-wise)        [64,64]
//   da_t (summed over the keys) = sum_{r >= t} sum_{s < t} Z_rs: a row prefix, then a column
//   suffix, sums only (no cancellation, as the CPU twin)  -> bp.part slot kPartDaIntra
// q, k are qn, kn (the fused L2 norm applied on load, chunk_bwd_tiles.cuh), streamed in passes of
// up to 64 keys (q k^T and k k^T accumulate across the passes in registers); dq, dk of a pass
// added to dqv, dkv (kernel 1's parts), or, with BwdParams::direct_qk (no norm, G = 1), written to
// dq, dk in their dtypes. Products: mma.sync m16n8k8, 3xTF32 where
// bwd_split_products says so, else one TF32 product (chunk_bwd.cuh). Tiles [64][72] (8 mod 32
// words: every fragment pattern below is free of bank conflicts with scalar loads).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdM = 72;  // [64][72] tiles: M_A, M_L, q and k passes
constexpr int kLdZ = 65;  // Z: row r read by thread r (prefix), column t by thread t (suffix)
constexpr int kPass = 64;  // keys per pass

struct IntraGdnSmem {
  static constexpr int kTile = kChunk * kLdM;
  static constexpr int floats = 4 * kTile + kChunk * kLdZ + 2 * kChunk;
  float *MA, *ML, *q, *k, *Z, *gs, *bet;
  __device__ explicit IntraGdnSmem(float* s)
      : MA(s), ML(s + kTile), q(s + 2 * kTile), k(s + 3 * kTile), Z(s + 4 * kTile), gs(Z + kChunk * kLdZ), bet(gs + kChunk) {}
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

// q k^T and k k^T over the pass's keys (NP columns), lower 16x16 blocks only: warp w owns rows
// 16 (w % 4) and the 8-column tiles 4 (w / 4) + j.
template <int NP, bool S>
__device__ void gram_products(const IntraGdnSmem& s, float (&qk)[4][4], float (&kk)[4][4]) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
  auto rows = [](const float* t) { return [t](int m, int k) { return t[m * kLdM + k]; }; };
#pragma unroll 2
  for (int k0 = 0; k0 < NP; k0 += 8) {
    const FragA<S> aq = load_a<S>(rows(s.q), m0, k0), ak = load_a<S>(rows(s.k), m0, k0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (n0 + 8 * j >= m0 + 16) continue;  // the whole tile has s > r
      const FragB<S> b = load_b<S>([&](int k, int n) { return s.k[n * kLdM + k]; }, k0, n0 + 8 * j);
      mma<S>(qk[j], aq, b);
      mma<S>(kk[j], ak, b);
    }
  }
}

// dq = M_A k and dk = M_L k + M_A^T q + M_L^T k for the pass's NP key columns: warp w owns rows
// 16 (w % 4) and the 8-column tiles (w / 4) NP/16 + j. Zero blocks of the triangles are skipped.
template <int NP, bool S>
__device__ void intra_products(const IntraGdnSmem& s, float (&dq)[NP / 16][4], float (&dk)[NP / 16][4]) {
  constexpr int NJ = NP / 16;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = (w >> 2) * (NP / 2);
  auto kmaj = [](const float* t) { return [t](int k, int n) { return t[k * kLdM + n]; }; };
  for (int k0 = 0; k0 < m0 + 16; k0 += 8) {  // M_A, M_L rows r < m0 + 16: columns s <= r
    const FragA<S> aA = load_a<S>([&](int m, int k) { return s.MA[m * kLdM + k]; }, m0, k0);
    const FragA<S> aL = load_a<S>([&](int m, int k) { return s.ML[m * kLdM + k]; }, m0, k0);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const FragB<S> bk = load_b<S>(kmaj(s.k), k0, n0 + 8 * j);
      mma<S>(dq[j], aA, bk);
      mma<S>(dk[j], aL, bk);
    }
  }
  for (int k0 = m0; k0 < kChunk; k0 += 8) {  // transposed: rows t >= r of M_A, M_L
    const FragA<S> aA = load_a<S>([&](int m, int k) { return s.MA[k * kLdM + m]; }, m0, k0);
    const FragA<S> aL = load_a<S>([&](int m, int k) { return s.ML[k * kLdM + m]; }, m0, k0);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      mma<S>(dk[j], aA, load_b<S>(kmaj(s.q), k0, n0 + 8 * j));
      mma<S>(dk[j], aL, load_b<S>(kmaj(s.k), k0, n0 + 8 * j));
    }
  }
}

// dqv, dkv += this pass's dq, dk (columns d0 + ...; rows < L), all loads before the stores; with
// BwdParams::direct_qk the sums are dq, dk themselves (kernel intra is their last writer), stored in
// the outputs' dtypes, and finish's qk pass does not run.
template <int NP>
__device__ void add_pass(const BwdParams& bp, const ChunkInfo& ck, int hv, int d0, const float (&dq)[NP / 16][4],
                         const float (&dk)[NP / 16][4]) {
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
      const int r = acc_row(m0, 2 * h);
      if (r >= ck.len) continue;
      const int d = d0 + acc_col(n0 + 8 * j, 0);
      const float2 xq = make_float2(gq[j][h].x + dq[j][2 * h], gq[j][h].y + dq[j][2 * h + 1]);
      const float2 xk = make_float2(gk[j][h].x + dk[j][2 * h], gk[j][h].y + dk[j][2 * h + 1]);
      if (bp.direct_qk) {  // G = 1, no norm: value head hv is q/k head hv, and these are dq, dk
        store_pair(bp.dq, ck.t0 + r, hv, d, xq), store_pair(bp.dk, ck.t0 + r, hv, d, xk);
      } else {
        const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * p.K + d;
        *reinterpret_cast<float2*>(bp.dqv + o) = xq, *reinterpret_cast<float2*>(bp.dkv + o) = xk;
      }
    }
}

// Z from the gram accumulators, then da_t = sum_{r >= t} (row prefix of Z)_r(t) -> the partial slot.
__device__ void intra_gate_gdn(const BwdParams& bp, const IntraGdnSmem& s, const ChunkInfo& ck, int hv,
                               const float (&qk)[4][4], const float (&kk)[4][4]) {
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 32 * (w >> 2), L = ck.len;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e), c = acc_col(n0 + 8 * j, e);
      s.Z[r * kLdZ + c] = c < r ? s.MA[r * kLdM + c] * qk[j][e] + s.ML[r * kLdM + c] * kk[j][e] : 0.0f;
    }
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

template <int KD, bool kSplit>
__global__ void __launch_bounds__(kBwdThreads, 2) bwd_intra_gdn_kernel(const __grid_constant__ BwdParams bp) {
  constexpr int NP = KD < kPass ? KD : kPass;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[blockIdx.x];
  const int hv = blockIdx.y, L = ck.len, h = hv / p.G;
  const int64_t blk = int64_t(blockIdx.x) * p.HV + hv;
  extern __shared__ __align__(16) float smem[];
  const IntraGdnSmem s(smem);
  copy_rows_async(s.MA, kLdM, bp.dAc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  copy_rows_async(s.ML, kLdM, bp.Wc + blk * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  copy_gates_async<false>(s.gs, 0, p, ck, hv, 0, 1);
  for (int r = threadIdx.x; r < kChunk; r += kBwdThreads) s.bet[r] = r < L ? p.beta_e[int64_t(ck.t0 + r) * p.HV + hv] : 0.0f;
  cp_async_wait_all();
  __syncthreads();
  build_masks(s, L);
  float qk[4][4] = {}, kk[4][4] = {};
  const bool vec = qk_rows_vec16(p);
  for (int d0 = 0; d0 < KD; d0 += NP) {
    __syncthreads();  // build_masks, or the previous pass, is done
    QkSlab x[NP / kSlab];  // every slab's loads in flight before the first store: one round trip per pass
#pragma unroll
    for (int c = 0; c < NP; c += kSlab) x[c / kSlab].load(p, ck.t0, h, L, d0 + c, true, vec);
#pragma unroll
    for (int c = 0; c < NP; c += kSlab) x[c / kSlab].store(s.q + c, s.k + c, kLdM, p, ck.t0, h, L, d0 + c);
    __syncthreads();
    gram_products<NP, kSplit>(s, qk, kk);
    float dq[NP / 16][4] = {}, dk[NP / 16][4] = {};
    intra_products<NP, kSplit>(s, dq, dk);
    add_pass<NP>(bp, ck, hv, d0, dq, dk);
  }
  intra_gate_gdn(bp, s, ck, hv, qk, kk);
}

}  // namespace

void launch_bwd_intra_gdn(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  const size_t smem = sizeof(float) * IntraGdnSmem::floats;
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    launch_kernel(bwd_intra_gdn_kernel<KD, decltype(split)::value>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
