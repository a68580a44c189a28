// Shared-memory tiles and their cp.async loads for the state kernel (chunk_state.cu): the layout of
// one block's tiles for (input type, K, BV, variant), the two load groups of a chunk, and which
// accumulator tiles of the state each warp owns.
//   group A: Ws [64][K+4] w rows, Us [64][BV+4] u columns, Qs [64][K] q (gdn, input type) or qg
//            (kda, float32), gates of the chunk (double-buffered by chunk parity)
//   group B: Kt [64][K+8] k (gdn) or kg (kda), As [64][68] Aqk
// 8 warps: warps 0-3 form vnew = u - w S (16 rows each), warps 4-7 form q S and the output, and all
// 8 share the state update.
//   written by the kernel: St = S^T [BV][K+4] (and Stp, its copy with rows in the permuted k order
//   of the 16-bit q fragments), VNt = vnew^T and VEt = (gated vnew)^T [BV][68]
// One stage of tiles: double-buffering them (chunk c+1 loading during chunk c) was measured and
// gained nothing, the kernel being issue-bound (docs/CUDA.md); `st` stays as the stage index.
// Covered by tests/cuda/test_cuda_stages.cpp ("state") and test_cuda_forward.cpp.
#pragma once

#include <type_traits>

#include "cuda/chunk_params.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda::state {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kLdA = 68, kLdV = kChunk + 4;


// kPermQ: gdn with 16-bit q and unsplit products, whose q fragments come by ldmatrix in a permuted k
// order (tile_mma.cuh ldm_a_row16_perm); S^T is then also kept with its rows permuted (Stp).
template <class Tin, int KD, int BV, bool kKDA, bool kPermQ>
struct StateSmem {
  using In = Tin;
  using KT = std::conditional_t<kKDA, float, Tin>;  // element type of the k and q tiles
  static constexpr int kKD = KD, kBVw = BV;
  static constexpr bool kIsKDA = kKDA, kPermutedQ = kPermQ;
  static constexpr int ldw = KD + 4, ldk = ld_col<KT>(KD), ldq = ld_row<KT>(KD), ldu = ld_row<float>(BV), lds = KD + 4;
  static constexpr int gates = kKDA ? 2 * KD : 3 * 2 * kChunk;  // kda: b_end [2][K]; gdn: b, rq, rk [2][64]
  static constexpr size_t bytes_w = align16(4 * kChunk * ldw), bytes_u = align16(4 * kChunk * ldu),
                          bytes_q = align16(sizeof(KT) * kChunk * ldq), bytes_k = align16(sizeof(KT) * kChunk * ldk),
                          bytes_a = align16(4 * kChunk * kLdA), bytes_s = align16(4 * BV * lds),
                          bytes_v = align16(4 * BV * kLdV), bytes_g = align16(4 * gates);
  static constexpr size_t bytes_stage = bytes_w + bytes_u + bytes_q + bytes_k + bytes_a;
  static constexpr size_t bytes = bytes_stage + (kPermQ ? 2 : 1) * bytes_s + 2 * bytes_v + bytes_g;
  char* tiles;
  float *St, *Stp, *VNt, *VEt, *G;  // St = S^T [BV][K], Stp = its k-permuted copy, VNt / VEt = vnew^T, vt^T [BV][64]
  __device__ explicit StateSmem(char* b) {
    tiles = b, b += bytes_stage;
    St = reinterpret_cast<float*>(b), b += bytes_s;
    Stp = kPermQ ? reinterpret_cast<float*>(b) : nullptr, b += kPermQ ? bytes_s : 0;
    VNt = reinterpret_cast<float*>(b), b += bytes_v;
    VEt = reinterpret_cast<float*>(b), b += bytes_v;
    G = reinterpret_cast<float*>(b);
  }
  __device__ char* stage(int) const { return tiles; }  // one stage: double buffering measured no gain
  __device__ float* Ws(int st) const { return reinterpret_cast<float*>(stage(st)); }
  __device__ float* Us(int st) const { return reinterpret_cast<float*>(stage(st) + bytes_w); }
  __device__ KT* Qs(int st) const { return reinterpret_cast<KT*>(stage(st) + bytes_w + bytes_u); }
  __device__ KT* Kt(int st) const { return reinterpret_cast<KT*>(stage(st) + bytes_w + bytes_u + bytes_q); }
  __device__ float* As(int st) const { return reinterpret_cast<float*>(stage(st) + bytes_w + bytes_u + bytes_q + bytes_k); }
  __device__ float* gb(int buf) const { return G + buf * kChunk; }                // gdn: b of each row
  __device__ float* rq(int buf) const { return G + 2 * kChunk + buf * kChunk; }   // gdn: rstd of q
  __device__ float* rk(int buf) const { return G + 4 * kChunk + buf * kChunk; }   // gdn: rstd of k
  __device__ float* bend(int buf) const { return G + buf * KD; }                 // kda: b of the last row
};

// 16-byte copies of 64 rows x kBytes by the block's threads (tile_mma.cuh copy_rows_async); a full
// chunk (every chunk of a sequence but its last) takes the form without the row test and the
// zero-fill address select (ncu, kda T = 32768: the two copy groups were 38% of the chain's warp
// instructions, ~8.7 per 16-byte copy, with 13% of its stall samples on long scoreboard there;
// halved by this form, the chain's time did not move: its step is latency-bound, BENCHMARKS.md, 31st).
template <int kBytes, class T>
__device__ __forceinline__ void copy_rows(T* dst, int ld, int L, const T* src, int stride) {
  with_full_chunk(L, [&](auto full) { copy_rows_async<kChunk, kBytes, kThreads, decltype(full)::value>(dst, ld, L, src, stride); });
}

// Group A of chunk `ck` into tile stage `st` and gate buffer `buf`: w, u, q (only
// with the fused output), gates.
template <class Sm>
__device__ void issue_group_a(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int st, int buf, const Sm& s) {
  using Tin = typename Sm::In;
  constexpr int KD = Sm::kKD, BV = Sm::kBVw;
  const ChunkParams& p = sp.c;
  const int h = hv / p.G, L = ck.len;
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;  // (token, head) row of the chunk's first token
  copy_rows<4 * KD>(s.Ws(st), Sm::ldw, L, p.w + row0 * KD, p.HV * KD);
  if (takes_u(sp, v0)) copy_rows<4 * BV>(s.Us(st), Sm::ldu, L, sp.u + row0 * u_width(sp) + v0, p.HV * u_width(sp));
  if (sp.o.p) {
    if constexpr (Sm::kIsKDA)
      copy_rows<4 * KD>(s.Qs(st), Sm::ldq, L, p.qg + row0 * KD, p.HV * KD);
    else
      copy_rows<int(sizeof(Tin)) * KD>(s.Qs(st), Sm::ldq, L, static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0, h),
                                       int(p.q.st));
  }
  if constexpr (Sm::kIsKDA) {
    const float* last = p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * KD;
    for (int d4 = threadIdx.x; d4 < KD / 4; d4 += kThreads) cp_async16(s.bend(buf) + 4 * d4, last + 4 * d4, true);
  } else {
    for (int r = threadIdx.x; r < kChunk; r += kThreads) {
      const bool valid = r < L;
      const int64_t tt = ck.t0 + (valid ? r : 0);
      cp_async4(s.gb(buf) + r, p.gcum + tt * p.HV + hv, valid);
      if (p.l2norm) {
        cp_async4(s.rq(buf) + r, p.rstd_q + tt * p.H + h, valid);
        cp_async4(s.rk(buf) + r, p.rstd_k + tt * p.H + h, valid);
      }
    }
  }
}

// Group B of chunk `ck` (index ci) into tile stage `st`: k (gdn) or kg (kda), and
// Aqk with the output.
template <class Sm>
__device__ void issue_group_b(const StateParams& sp, const ChunkInfo& ck, int ci, int hv, int st, const Sm& s) {
  using Tin = typename Sm::In;
  constexpr int KD = Sm::kKD;
  const ChunkParams& p = sp.c;
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;
  if constexpr (Sm::kIsKDA)
    copy_rows<4 * KD>(s.Kt(st), Sm::ldk, ck.len, p.kg + row0 * KD, p.HV * KD);
  else
    copy_rows<int(sizeof(Tin)) * KD>(s.Kt(st), Sm::ldk, ck.len,
                                     static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0, hv / p.G), int(p.k.st));
  if (sp.o.p) copy_rows<4 * kChunk>(s.As(st), kLdA, kChunk, p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk, kChunk);
}

// The accumulator tiles of S a warp owns (all 8 warps): m-tiles wm + WM*i, n-tiles wn*NTW + j.
template <int KD, int BV>
struct StateTiling {
  static constexpr int MT = KD / 16, NT8 = BV / 8, WM = MT < kWarps ? MT : kWarps, WN = kWarps / WM;
  static constexpr int MTW = MT / WM, NTW = NT8 / WN;
  static_assert(NTW >= 1 && MTW * WM == MT && NTW * WN == NT8, "state tile does not split over the warps");
  __device__ static int m0(int i) { return 16 * (int(threadIdx.x >> 5) % WM + WM * i); }
  __device__ static int n0(int j) { return 8 * (((threadIdx.x >> 5) / WM) * NTW + j); }
};
template <int KD, int BV>
using StateRegs = float[StateTiling<KD, BV>::MTW][StateTiling<KD, BV>::NTW][4];

template <int KD, int BV, class F>
__device__ void for_state_elems(F&& f) {
  using Tl = StateTiling<KD, BV>;
#pragma unroll
  for (int i = 0; i < Tl::MTW; ++i)
#pragma unroll
    for (int j = 0; j < Tl::NTW; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(i, j, e, acc_row(Tl::m0(i), e), acc_col(Tl::n0(j), e));
}

}  // namespace kcp::cuda::state
