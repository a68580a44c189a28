// The kkt stage's (chunk_kkt.cu) block shape, its shared-memory layout, and its last two steps on the
// tiles it holds: P = (I + Lmat)^-1 by forward substitution and tensor-core block merges
// (solve_unit_lower), and gdn's w = P (beta rk 2^b k) where no u is wanted (write_w,
// ChunkParams::kkt_writes_w). Included by chunk_kkt.cu alone.
// Covered by tests/cuda/test_cuda_stages.cpp ("kkt P", "kkt w").
#pragma once

#include <algorithm>

#include "cuda/chunk_params.cuh"
#include "cuda/chunk_rows.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda::kkt {

// gdn: 4 warps (its 16-bit dots form each row block's fragments by ldmatrix, cheap to share among
// few warps); kda, gla: 8 (gla ran at 18% occupancy with 4: 3 blocks of 67.8 KiB per multiprocessor).
template <bool kKDA>
constexpr int kkt_threads = kKDA ? 256 : 128;

// The n-tiles [lo, hi) of row block i that a warp takes. 8 warps: row blocks 0..3 (2, 4, 6, 8
// n-tiles) get 1, 2, 2, 3 warps of at most 3 tiles each; a warp forms its row block's A fragments
// itself (kda: per lane and k step 4 exp2, 8 gate and 8 k, q loads, worth ~2.5 n-tiles), so row blocks are not paired.
// The warp whose range holds n-tile 2i (the diagonal block's first) also owns kda's pairwise diagonal.
struct WarpTiles {
  int i, lo, hi;
};
template <int kThreads>
__device__ __forceinline__ WarpTiles warp_tiles(int warp) {
  if constexpr (kThreads == 128) return {warp, 0, 2 * warp + 2};
  // warps 0..7: i = 0 1 1 2 2 3 3 3, lo = 0 0 2 0 3 0 3 6, hi = 2 2 4 3 6 3 6 8, a nibble each (an
  // indexed constant array went to local memory)
  const int sh = 4 * warp;
  return {int(0x33322110u >> sh) & 15, int(0x63030200u >> sh) & 15, int(0x86363422u >> sh) & 15};
}
// Most n-tiles one warp takes (its accumulators: [kMaxTiles][4] per product).
template <int kThreads>
constexpr int kMaxTiles = kThreads == 128 ? 8 : 3;
constexpr int kLdL = 68;                  // 64x64 float tiles (row-major A pattern)


// kda, gla: row r of the raw tiles holds k then q (16 bytes of padding), so that gla's anchored path
// can write its float32 kg row over them (chunk_kkt_gla.cuh); ld_raw, the row in floats, is 4 mod 32
// at every K, as ldmatrix's conflict-free rows need. gdn: k tile, then q tile.
template <class Tin, int KD, bool kKDA>
struct KktSmem {
  static constexpr int ldk = kKDA ? 2 * KD + 16 / int(sizeof(Tin)) : ld_row<Tin>(KD), ldg = kKDA ? KD + 4 : 1;
  static constexpr int ld_raw = ldk * int(sizeof(Tin)) / 4;
  static_assert(!kKDA || (ld_raw % 32 == 4 && ld_raw >= KD), "kg's float32 rows over the raw rows");
  // The raw tiles are dead once the products are done, and P and the solve's scratch reuse that
  // space; gdn's k tile excepted, which w = P (beta k Gamma) reads after the solve (write_w): there P
  // lies over the q tile and the solve's scratch over Lmat's first 16 rows, which only the diagonal
  // blocks' solve reads, before the scratch's first write.
  static constexpr size_t bytes_tile = align16(sizeof(Tin) * kChunk * ldk);
  static constexpr size_t bytes_kq = kKDA ? std::max(bytes_tile, align16(4 * (kChunk + 16) * kLdL))
                                          : bytes_tile + std::max(bytes_tile, align16(4 * kChunk * kLdL));
  // Lmat last: gla (no delta rule) never touches it and launches without it (3 blocks per
  // multiprocessor instead of 2 at K = 128 with 16-bit inputs).
  static constexpr size_t bytes_lmat = 4 * kChunk * kLdL;
  static constexpr size_t bytes = bytes_kq + align16(4 * kChunk * ldg) + 4 * 4 * kChunk + bytes_lmat;
  Tin *ks, *qs;
  float *gs, *bet, *rk, *rq, *fw, *Ls, *Ps, *Xs;  // fw: w's row factors (write_w)
  __device__ explicit KktSmem(char* b) {
    ks = reinterpret_cast<Tin*>(b), qs = ks + (kKDA ? KD : kChunk * ldk);
    Ps = reinterpret_cast<float*>(kKDA ? b : b + bytes_tile);
    b += bytes_kq;
    gs = reinterpret_cast<float*>(b), b += align16(4 * kChunk * ldg);
    bet = reinterpret_cast<float*>(b), rk = bet + kChunk, rq = rk + kChunk, fw = rq + kChunk;
    Ls = fw + kChunk;
    Xs = kKDA ? Ps + kChunk * kLdL : Ls;
  }
};

// P = (I + Ls)^-1 into Ps. The four 16x16 diagonal blocks by forward substitution (one warp per
// block, one column per lane, the column in registers), then block rows i = 1..3 on tensor cores:
// X = Lmat[i, <i] @ P[<i, <i] and P[i, <i] = -P_ii @ X (3xTF32 when products are split). kThreads:
// the block's (the diagonal blocks take warps 0..3).
template <bool S, int kThreads>
__device__ void solve_unit_lower(const float* Ls, float* Ps, float* Xs) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int idx = threadIdx.x; idx < kChunk * kLdL / 4; idx += kThreads)
    reinterpret_cast<float4*>(Ps)[idx] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __syncthreads();
  if (warp < 4 && lane < 16) {
    const int base = 16 * warp, c = lane;
    float col[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < r; ++j) acc += j >= c ? Ls[(base + r) * kLdL + base + j] * col[j] : 0.0f;
      col[r] = r < c ? 0.0f : (r == c ? 1.0f : -acc);
      Ps[(base + r) * kLdL + base + c] = col[r];
    }
  }
  __syncthreads();
  for (int i = 1; i < 4; ++i) {
    const int w = 16 * i;  // block row i: rows w..w+15, off-diagonal columns 0..w-1 (2i n-tiles)
    for (int nt = warp; nt < 2 * i; nt += kWarps) {
      float acc[4] = {};
      for (int k0 = 8 * nt; k0 < w; k0 += 8)  // P is lower triangular: rows < 8nt of column tile nt are 0
        mma(acc, ldm_a_row<S>(Ls, kLdL, w, k0, false), load_b_kn<S>(Ps, kLdL, k0, 8 * nt));
#pragma unroll
      for (int e = 0; e < 4; ++e) Xs[(acc_row(0, e)) * kLdL + acc_col(8 * nt, e)] = acc[e];
    }
    __syncthreads();
    for (int nt = warp; nt < 2 * i; nt += kWarps) {
      float acc[4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) mma(acc, ldm_a_row<S>(Ps + w, kLdL, w, k0, false), load_b_kn<S>(Xs, kLdL, k0, 8 * nt));
#pragma unroll
      for (int e = 0; e < 4; ++e) Ps[(w + acc_row(0, e)) * kLdL + acc_col(8 * nt, e)] = -acc[e];
    }
    __syncthreads();
  }
}

// gdn where the pipeline wants w without u (ChunkParams::kkt_writes_w): w = P (beta rk 2^b k) [L, K]
// from the P and raw k tiles this block holds, bit for bit what the WY stage would write (chunk_wy.cu:
// the same TF32 operands, P rounded as kkt stores it and the right-hand side rounded after its row
// factor, the same k steps in the same order per row block, w stored rounded), without that stage's
// launch and its reads of P and k. Warp j takes the columns [j KD / 4, (j + 1) KD / 4) of every row
// block; each B fragment serves the row blocks at and below its k step (P is lower triangular).
template <class Tin, int KD>
__device__ void write_w(const ChunkParams& p, const ChunkInfo& ck, int hv, const KktSmem<Tin, KD, false>& s) {
  constexpr int ld = KktSmem<Tin, KD, false>::ldk, NT = KD / 32;
  static_assert(KD % 32 == 0, "whole n-tiles per warp");
  const int L = ck.len, c0 = int(threadIdx.x >> 5) * (KD / 4);
  for (int r = threadIdx.x; r < kChunk; r += kkt_threads<false>) s.fw[r] = s.bet[r] * s.rk[r] * exp2f(s.gs[r]);
  __syncthreads();
  float acc[4][NT][4] = {};
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += 8) {
    if (k0 >= L) break;
    FragB<false> b[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      b[nt] = load_b<false, true>(
          [&](int r, int d) { return r < L ? tf32_round(to_float(s.ks[r * ld + c0 + d]) * s.fw[r]) : 0.0f; }, k0, 8 * nt);
#pragma unroll
    for (int i = k0 / 16; i < 4; ++i) {
      if (16 * i >= L) break;
      const FragA<false> a = ldm_a_row<false>(s.Ps, kLdL, 16 * i, k0, false);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma(acc[i][nt], a, b[nt]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = acc_row(16 * i, e), c = c0 + acc_col(8 * nt, e);
        if (r < L)
          *reinterpret_cast<float2*>(p.w + (int64_t(ck.t0 + r) * p.HV + hv) * KD + c) =
              make_float2(tf32_round(acc[i][nt][e]), tf32_round(acc[i][nt][e + 1]));
      }
}

}  // namespace kcp::cuda::kkt
