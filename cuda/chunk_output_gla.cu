// Stage "output" of gla (its state chain: chunk_state_gla.cu), in parallel over the chunks from the
// states h[c] the chain stored: one block of 8 warps per (chunk c, value head hv, BVo = 64 or 32
// columns),
//   o_r = scale qg_r h[c] + sum_{s <= r} Aqk[r, s] v_s    (rows r < L; Aqk carries scale and the decay,
//   qg = q rq 2^b; both from the kkt stage),
// qg by ldmatrix, h as the plain forward's chain stored it, TF32-rounded (StateParams::h_tf32), else
// rounded once in shared memory by the threads that copied it (kept states, the halves, the stage
// tests' fed h), Aqk pairs by 8-byte loads, v by ldmatrix.trans; two cp.async groups, h's issued
// before the chunk's table entry is needed. (Forming qg here from q and the raw gates instead of
// reading kkt's, to save qg's float32 write and read, measured slower: the gate scan on each block's
// path, state+output 0.821 -> 1.060 ms at T = 32768; docs/BENCHMARKS.md, twentieth session.)
// Products: TF32 with 16-bit inputs (qg TF32-rounded, v exact, h rounded as the chain's S), 3xTF32
// with float32 inputs. Shapes: h [NT,HV,K,V] float32, o [B,T,HV,V]. With the chain in halves
// (StateParams::mid, chunk_state_gla_halves.cu) a second-half chunk's h tile is corrected in shared
// memory first, h_local + D_c s_mid (correct_own_rows), and written back where the backward reads h.
// Covered by tests/cuda/test_cuda_stages.cpp (output o for gla against the CPU twin, from the twin's
// h and qg), test_cuda_forward.cpp, test_cuda_keep.cpp, test_cuda_gla_halves.cpp.
#include "cuda/chunk_state_gla.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/gla_halves.cuh"
#include "cuda/key_dims.h"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {


constexpr int kOutThreads = 256;

template <class Tin, int KD, int BVo>
struct OutSmem {
  // qg (row-major A by ldmatrix: ld = 4 mod 32), h[c] (k-major B: ld = 8 mod 32), Aqk (A pairs at
  // columns k0 + 2t by 8-byte loads: ld = 8 mod 32), v (16-bit: rows 16-byte aligned for
  // ldmatrix.trans, conflict-free; float: scalar loads at rows k0 + 2t)
  static constexpr int ldq = KD + 4, ldh = BVo + 8, lda = kChunk + 8, ldv = sizeof(Tin) == 2 ? BVo + 8 : BVo + 4;
  static constexpr size_t bytes_q = align16(4 * kChunk * ldq), bytes_h = align16(4 * KD * ldh),
                          bytes_a = align16(4 * kChunk * lda), bytes_v = align16(sizeof(Tin) * kChunk * ldv);
  static constexpr size_t bytes = bytes_q + bytes_h + bytes_a + bytes_v;
  float *Qs, *Hs, *As;
  Tin* Vs;
  __device__ explicit OutSmem(char* b) {
    Qs = reinterpret_cast<float*>(b), Hs = reinterpret_cast<float*>(b + bytes_q);
    As = reinterpret_cast<float*>(b + bytes_q + bytes_h), Vs = reinterpret_cast<Tin*>(b + bytes_q + bytes_h + bytes_a);
  }
};

// Two cp.async groups: {qg, h[c]} for the first product, {Aqk, v} for the second.
template <class Tin, int KD, int BVo>
__device__ void issue_output_tiles(const StateParams& sp, const ChunkInfo& ck, int ci, int hv, int j0,
                                   const OutSmem<Tin, KD, BVo>& s) {
  using Sm = OutSmem<Tin, KD, BVo>;
  const ChunkParams& p = sp.c;
  // h[c] first: its address does not wait for the chunk's table entry (ck), which qg's does
  copy_rows_async<KD, 4 * BVo, kOutThreads>(s.Hs, Sm::ldh, KD, sp.h + (int64_t(ci) * p.HV + hv) * KD * p.V + j0, p.V);
  copy_rows_async<kChunk, 4 * KD, kOutThreads>(s.Qs, Sm::ldq, ck.len, p.qg + (int64_t(ck.t0) * p.HV + hv) * KD, p.HV * KD);
  cp_async_commit();
  copy_rows_async<kChunk, 4 * kChunk, kOutThreads>(s.As, Sm::lda, kChunk, p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk,
                                                   kChunk);
  copy_rows_async<kChunk, int(sizeof(Tin)) * BVo, kOutThreads>(
      s.Vs, Sm::ldv, ck.len, static_cast<const Tin*>(p.v.p) + row_off(p.v, ck.t0, hv) + j0, int(p.v.st));
  cp_async_commit();
}

// o += Aqk v for this warp's rows [mw, mw+16) and NTW n-tiles from column c0, in the k order of
// chain_products (A pairs at columns k0 + 2t, k0 + 2t + 1; B by ldmatrix.trans for 16-bit v).
template <bool S, class Tin, class Sm, int NTW>
__device__ void intra_products(const Sm& s, int L, int mw, int c0, float (&ao)[NTW][4]) {
  const int t = lane_t(), g = lane_g(), l = int(threadIdx.x & 31);
  for (int k0 = 0; k0 < L; k0 += 8) {  // Aqk's columns >= L and v's rows >= L are zero
    const float2 x0 = *reinterpret_cast<const float2*>(s.As + (mw + g) * Sm::lda + k0 + 2 * t);
    const float2 x1 = *reinterpret_cast<const float2*>(s.As + (mw + g + 8) * Sm::lda + k0 + 2 * t);
    FragA<S> fa;  // Aqk arrives TF32-rounded (or is split)
    fa.set_exact(0, x0.x), fa.set_exact(1, x1.x), fa.set_exact(2, x0.y), fa.set_exact(3, x1.y);
    if constexpr (sizeof(Tin) == 2) {
      uint32_t r[4];  // matrix j: rows k0..k0+7, columns c0 + 8 (j % NTW)
      ldsm_x4_trans(r, s.Vs + (k0 + (l & 7)) * Sm::ldv + c0 + 8 * ((l >> 3) % NTW));
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt) {
        FragB<S> fb;
        fb.hi[0] = widen_lo<Tin>(r[nt]), fb.hi[1] = widen_hi<Tin>(r[nt]);
        mma(ao[nt], fa, fb);
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt) {
        FragB<S> fb;
        fb.set(0, to_float(s.Vs[(k0 + 2 * t) * Sm::ldv + c0 + 8 * nt + g]));
        fb.set(1, to_float(s.Vs[(k0 + 2 * t + 1) * Sm::ldv + c0 + 8 * nt + g]));
        mma(ao[nt], fa, fb);
      }
    }
  }
}

// Warp w: rows 16 (w % 4), columns [c0, c0 + BVo/2) with c0 = (w / 4) BVo/2.
template <class Tin, int KD, int BVo>
__global__ void __launch_bounds__(kOutThreads) gla_output_kernel(const StateParams sp) {
  using Sm = OutSmem<Tin, KD, BVo>;
  constexpr bool S = kSplitProducts<Tin>;
  constexpr int NTW = BVo / 16;  // 8-column n-tiles per warp
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const int nvt = p.V / BVo, ci = blockIdx.x / nvt, j0 = (blockIdx.x % nvt) * BVo, hv = blockIdx.y;
  const ChunkInfo ck = chunk_at(p, ci);
  issue_output_tiles<Tin, KD, BVo>(sp, ck, ci, hv, j0, s);
  const int w = int(threadIdx.x >> 5), mw = 16 * (w % 4), c0 = (w / 4) * (BVo / 2);
  float ao[NTW][4] = {};
  cp_async_wait<1>();
  if constexpr (!S) {
    if (sp.mid > 0 && ci >= sp.mid) {  // the chain in halves: h_local + D_c s_mid (gla_halves.cuh)
      const int64_t t = (int64_t(ci) * p.HV + hv) * KD;
      correct_own_rows<KD, BVo, kOutThreads>(sp.decay + t, sp.s_mid + int64_t(hv) * KD * p.V + j0,
                                            sp.mid_store_h ? sp.h + t * p.V + j0 : nullptr, p.V, s.Hs, Sm::ldh);
    }
    if (!sp.h_tf32) round_own_rows_tf32<KD, 4 * BVo, kOutThreads>(s.Hs, Sm::ldh);  // each h element once, not per warp
  }
  __syncthreads();
  rows_times_tile<S, true, KD>(s.Qs, Sm::ldq, s.Hs, Sm::ldh, mw, c0, ao);  // qg arrives TF32-rounded (or is split)
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) ao[nt][e] *= p.scale;
  cp_async_wait<0>();
  __syncthreads();
  intra_products<S, Tin, Sm, NTW>(s, ck.len, mw, c0, ao);
  store_acc_rows(sp.o.p, sp.o.dt, int64_t(ck.t0) * sp.o.st + int64_t(hv) * sp.o.sx + j0 + c0, sp.o.st, ck.len, mw, ao);
}

}  // namespace

void launch_gla_output(const StateParams& sp, int input_dtype, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(p.gla && sp.h && sp.o.p && p.V % kValueTile == 0, "gla output: needs the stored states h and o, V a multiple of ",
            kValueTile);
  if (p.NT == 0 || p.HV == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      auto run = [&](auto bvo) {
        constexpr int BVo = decltype(bvo)::value;
        launch_kernel(gla_output_kernel<Tin, KD, BVo>, dim3(p.NT * (p.V / BVo), p.HV), kOutThreads, OutSmem<Tin, KD, BVo>::bytes,
                      stream, sp);
      };
      if (p.V % 64 == 0) run(std::integral_constant<int, 64>{});
      else run(std::integral_constant<int, 32>{});
    });
  });
}

}  // namespace kcp::cuda
