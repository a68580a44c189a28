// gla's kkt with one anchor per chunk (included by chunk_kkt.cu only). Where no key's gate cumsum is
// further than kMaxAnchorSpread from its last row's anywhere in the chunk, every pair (r, s <= r) goes
// through the chunk's last row:
//   Aqk[r,s] = scale * sum_d qa[r,d] kg[s,d],  qa = q rq 2^(b_r - b_end),  kg = k rk 2^(b_end - b_s),
// both factors within 2^-64 .. 2^64 (decaying gates: qa's >= 1, kg's <= 1),
// kg being the very operand the state chain reads (written to the workspace anyway). Both tiles are
// built once per chunk, element-wise with 16-byte shared memory accesses, and the products take their
// TF32 fragments by ldmatrix. The per-16-row anchors (chunk_kkt.cu, row_block_dots_tf32) built each
// fragment element from the raw tiles instead (an exp2 per element per n-tile row, the A fragments
// twice, once per warp of a row block): ~40% of gla kkt's instructions at T = 32768 (ncu, twenty-
// fourth session), the kernel issue-bound at half the DRAM bandwidth.
// Factors stay within 2^-64 .. 2^64 either way, so the TF32 operands carry the same relative
// rounding; chunks with a wider spread take the per-block path (tests/cuda/test_cuda_backward.cpp:
// "anchored and exact blocks in one chunk" puts 87+ log2 units into one block of every chunk, "gla
// with gates of both signs in one chunk" an excursion of 70 whose first and last rows are 61 apart).
// Smem: qa overwrites the gate tile in place (each thread its own slots), kg the raw k, q row it was
// formed from (the row's own warp, after a __syncwarp): the tiles need no space of their own.
// Covered by tests/cuda/test_cuda_stages.cpp ("kkt": Aqk, kg, qg, gcum against the CPU twin).
#pragma once

#include "cuda/chunk_params.cuh"
#include "cuda/chunk_rows.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

// The 4 keys d..d+3 a thread handles in gla_anchor_pass (fixed per thread: kThreads is a multiple of K/4).
template <int KD, int kThreads>
__device__ __forceinline__ int anchor_key() {
  static_assert(kThreads % (KD / 4) == 0, "gla anchor pass: a thread keeps its 4 keys in every sweep");
  return 4 * (int(threadIdx.x) % (KD / 4));
}

// Whether the chunk takes the single anchor (chunk_anchor_holds: block-wide, a barrier, so it also
// publishes the raw k, q tiles), each thread checking the rows and keys its pass will gate. be
// receives the chunk's last gate row at this thread's keys, read before the barrier because
// gla_anchor_pass overwrites the gate tile after it.
template <int KD, int kThreads>
__device__ bool gla_chunk_anchored(const float* gs, int ldg, int L, float (&be)[4]) {
  const int d = anchor_key<KD, kThreads>();
#pragma unroll
  for (int j = 0; j < 4; ++j) be[j] = gs[(L - 1) * ldg + d + j];
  return chunk_anchor_holds<4>(gs, ldg, L, d, int(threadIdx.x) / (KD / 4), kThreads / (KD / 4), be);
}

// Rows < L: kg, qg (and gcum: every row, or only row L-1 in gla's plain forward) to the workspace as
// chunk_kkt.cu's write_gated_rows does, qa into the gate tile's place and kg into the raw k, q row's
// (KktSmem interleaves them: row r holds k then q, ld_raw floats in all). One warp (or part of one)
// owns a row, so a __syncwarp between its reads and its writes orders them; every lane reaches it.
template <bool S, class Tin, int KD, int kThreads>
__device__ void gla_anchor_pass(const ChunkParams& p, const ChunkInfo& ck, int hv, Tin* raw, int ld_raw, float* gs,
                                int ldg, const float* rk, const float* rq, const float (&be)[4]) {
  constexpr int kRowStep = kThreads / (KD / 4);
  static_assert(32 % (KD / 4) == 0, "gla anchor pass: a row's threads within one warp");
  const int L = ck.len, d = anchor_key<KD, kThreads>(), r0 = int(threadIdx.x) / (KD / 4);
#pragma unroll 2
  for (int r = r0; r < kChunk; r += kRowStep) {
    float k[4] = {}, q[4] = {}, b[4] = {};
    float* row = reinterpret_cast<float*>(raw) + r * ld_raw;
    if (r < L) {
      lds4_float(reinterpret_cast<const Tin*>(row) + d, k), lds4_float(reinterpret_cast<const Tin*>(row) + KD + d, q);
      const float4 b4 = *reinterpret_cast<const float4*>(gs + r * ldg + d);
      b[0] = b4.x, b[1] = b4.y, b[2] = b4.z, b[3] = b4.w;
    }
    __syncwarp();  // the row's raw k, q read by all of its lanes before kg overwrites them
    if (r >= L) continue;
    float kg[4], qg[4], qa[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x = gated_kq<S>(k[e], q[e], rk[r], rq[r], b[e], be[e]);
      kg[e] = x.x, qg[e] = x.y;
      qa[e] = gated_q<S>(q[e], rq[r], b[e] - be[e]);  // qg's formula, anchored at the last row
    }
    const int64_t out = (int64_t(ck.t0 + r) * p.HV + hv) * KD + d;
    *reinterpret_cast<float4*>(p.kg + out) = make_float4(kg[0], kg[1], kg[2], kg[3]);
    *reinterpret_cast<float4*>(p.qg + out) = make_float4(qg[0], qg[1], qg[2], qg[3]);
    if (!p.forward_only) *reinterpret_cast<float4*>(p.gcum + out) = make_float4(b[0], b[1], b[2], b[3]);
    *reinterpret_cast<float4*>(gs + r * ldg + d) = make_float4(qa[0], qa[1], qa[2], qa[3]);
    *reinterpret_cast<float4*>(row + d) = make_float4(kg[0], kg[1], kg[2], kg[3]);
  }
  if (p.forward_only && int(threadIdx.x) < KD / 4)  // the chain reads each chunk's b_end row alone
    *reinterpret_cast<float4*>(p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * KD + d) = make_float4(be[0], be[1], be[2], be[3]);
  __syncthreads();
}

// Row block i's n-tiles [lo, hi) of qa kg^T (tiles [64][lda] and [64][ldb], TF32 values unless S),
// entries c <= r < L stored as scale * dot; the rest of the Aqk tile stays as zeroed. The two strides
// differ with float32 inputs (the raw rows hold 2 K + 4 floats, the gate tile's K + 4).
template <bool S, int KD>
__device__ void gla_anchored_products(const ChunkParams& p, int L, const float* qa, int lda, const float* kgt, int ldb,
                                      float* aqk, int i, int lo, int hi) {
  const int n = 16 * i, cnt = hi - lo;  // at most 3 n-tiles per warp (warp_tiles in chunk_kkt.cu)
  // acc[j] is n-tile lo + j: a loop over all 8 n-tiles with the warp's range as a condition issued
  // every tile's ldmatrix and mma predicated off (8 per k step where a warp has 1 to 3).
  float acc[3][4] = {};
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    const FragA<S> a = ldm_a_row<S>(qa, lda, n, k0, !S);
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if (j >= cnt) break;
      mma(acc[j], a, ldm_b_nk<S>(kgt, ldb, k0, 8 * (lo + j), !S));
    }
  }
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    if (j >= cnt) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(n, e), c = acc_col(8 * (lo + j), e);
      if (r < L && c <= r) aqk[r * kChunk + c] = operand_store<S>(p.scale * acc[j][e]);
    }
  }
}

}  // namespace kcp::cuda
