// Stage "WY": one block of 4 warps per (64-column slab, chunk, value head); warp i owns rows
// 16i..16i+15 of the slab's 64 x W output (W = 64, or 32 for the last slab of a 32-wide remainder):
//   w = P @ (beta * k * Gamma)    [L,K]   Gamma_s = 2^(b_s) (gdn: scalar per row, kda: per channel)
//   u = P @ (beta * v)            [L,V]
//   kda only, on the w slabs:  kg_r = k_r * 2^(b_end - b_r),  qg_r = q_r * 2^(b_r)   [L,K]
//         (kg transposed per chunk into ChunkParams::kg_t instead, where set: the transposed chain's)
//   gla (ChunkParams::gla): not run. w = 0 and u = v are never formed (the state kernel reads v),
//   and kg, qg are written by the kkt stage, which has the k, q and gate tiles loaded already.
// k and q carry the fused L2 norm (rstd per row). Unlike FLA, w, u, kg, qg stay float32 (FLA stores
// them in the input dtype); w, kg, qg, which only enter products later, are stored TF32-rounded when
// products are not split. The right-hand side (beta k Gamma, beta v) is formed once per slab in
// shared memory, TF32-rounded (build_rhs), so the product loop only loads it (ncu, 2026-11-29: the
// loop had formed each B element from x and its factor in place, and the factor loop divided its
// flat index: 2.6 instructions per cycle, the ALU the busiest pipe, 0.77 ms at kda T = 32768).
// Slabs are the fastest grid index so the blocks of one chunk share P in L2.
// Not run by the gdn forward with 16-bit inputs, whose state kernel folds w and u in
// (chunk_state_fold.cu), nor where gdn with 16-bit inputs wants w without u (the kept forward, the
// backward's recompute): kkt writes that w, bit for bit this stage's (chunk_kkt.cu write_w).
// Covered by tests/cuda/test_cuda_stages.cpp ("wy", and kkt's w against this stage's).
#include "cuda/chunk_wy.cuh"
#include "cuda/chunk_rows.cuh"
#include "cuda/chunk_state_kda.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128, kLdP = 68, kSlab = 64, kLdF = kSlab + 8;


template <class Tin, bool kKDA>
struct WySmem {
  static constexpr int ldx = ld_col<Tin>(kSlab);
  static constexpr size_t bytes_x = align16(sizeof(Tin) * kChunk * ldx);
  static constexpr size_t bytes = 4 * kChunk * kLdP + bytes_x * (kKDA ? 2 : 1) + 4 * kChunk * kLdF + 4 * 6 * kChunk;
  float *Ps, *F, *gs, *bet, *rk, *rq, *fr, *be;
  Tin *Xr, *Qr;
  __device__ explicit WySmem(char* b) {
    Ps = reinterpret_cast<float*>(b), b += 4 * kChunk * kLdP;
    Xr = reinterpret_cast<Tin*>(b), b += bytes_x;
    Qr = kKDA ? reinterpret_cast<Tin*>(b) : nullptr, b += kKDA ? bytes_x : 0;
    F = reinterpret_cast<float*>(b), b += 4 * kChunk * kLdF;
    gs = reinterpret_cast<float*>(b), bet = gs + kChunk, rk = bet + kChunk, rq = rk + kChunk, fr = rq + kChunk, be = fr + kChunk;
  }
};

// Which columns a slab covers: w columns [c0, c0+W) for z < ceil(K/64), then u columns.
struct Slab {
  bool is_w;
  int c0, W, D;
};
__device__ Slab slab_of(const ChunkParams& p, int z) {
  const int nw = (p.K + kSlab - 1) / kSlab;
  Slab sl;
  sl.is_w = z < nw, sl.D = sl.is_w ? p.K : p.V;
  sl.c0 = kSlab * (sl.is_w ? z : z - nw), sl.W = min(kSlab, sl.D - sl.c0);
  return sl;
}

// kW: the slab's width when known at compile time (a full slab: the copies' row and segment indices
// without an integer division by a run-time width), else 0 (sl.W).
template <int kW, class Tin, bool kKDA>
__device__ void load_slab(const ChunkParams& p, const ChunkInfo& ck, int ci, int hv, const Slab& sl, const WySmem<Tin, kKDA>& s) {
  using Sm = WySmem<Tin, kKDA>;
  const int W = kW ? kW : sl.W;
  const int h = hv / p.G, L = ck.len, per = 16 / int(sizeof(Tin)), segs = W / per;
  const float* P = p.P + (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
  for (int idx = threadIdx.x; idx < kChunk * kChunk / 4; idx += kThreads)
    cp_async16(s.Ps + (idx / 16) * kLdP + 4 * (idx % 16), P + 4 * idx, true);
  const RowsView& xv = sl.is_w ? p.k : p.v;
  const int x = sl.is_w ? h : hv;
  for (int idx = threadIdx.x; idx < kChunk * segs; idx += kThreads) {
    const int r = idx / segs, sg = idx % segs, rr = r < L ? r : 0;
    const int64_t off = row_off(xv, ck.t0 + rr, x) + sl.c0 + sg * per;
    cp_async16(s.Xr + r * Sm::ldx + sg * per, static_cast<const Tin*>(xv.p) + off, r < L);
    if (kKDA && sl.is_w)
      cp_async16(s.Qr + r * Sm::ldx + sg * per, static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0 + rr, h) + sl.c0 + sg * per, r < L);
  }
  if (kKDA && sl.is_w)  // raw gates of the slab's channels into F (overwritten by the factors later)
    for (int idx = threadIdx.x; idx < kChunk * W / 4; idx += kThreads) {
      const int r = idx / (W / 4), sg = idx % (W / 4);
      cp_async16(s.F + r * kLdF + 4 * sg, p.gcum + (int64_t(ck.t0 + min(r, L - 1)) * p.HV + hv) * p.K + sl.c0 + 4 * sg, true);
    }
  load_chunk_row_scalars<kKDA>(p, ck, hv, h, s.gs, s.bet, s.rk, s.rq);
  cp_async_commit();
  cp_async_wait<0>();
}

// kda's w slabs (F holds the raw gates b): Y = x beta rk 2^b per element into F, and the slab's kg,
// qg (kg's bits over Xr, Qr where the transposed chain takes kg^T: store_kg_t). Four channels per
// thread (16 threads per row): 16-byte loads and stores where the element loop had made one of each
// per element and recomputed its 64-bit output index (ncu: the loop and store_kg_t were ~50% of the
// kernel's instructions). Each thread overwrites only the elements it has read.
template <bool S, class Tin>
__device__ void build_gated_rhs(const ChunkParams& p, const ChunkInfo& ck, int hv, const Slab& sl, const WySmem<Tin, true>& s) {
  constexpr int ldx = WySmem<Tin, true>::ldx;
  static_assert(ldx % 4 == 0 && kLdF % 4 == 0, "16-byte rows");
  const int L = ck.len, d = 4 * int(threadIdx.x % 16);
  if (d >= sl.W) return;
  const float4 be4 = *reinterpret_cast<const float4*>(s.be + d);
  const float be[4] = {be4.x, be4.y, be4.z, be4.w};
#pragma unroll 2
  for (int r = int(threadIdx.x) / 16; r < kChunk; r += kThreads / 16) {
    float y[4] = {}, kg[4] = {};
    if (r < L) {
      const float4 b4 = *reinterpret_cast<const float4*>(s.F + r * kLdF + d);
      const float b[4] = {b4.x, b4.y, b4.z, b4.w};
      float x[4], q[4], qg[4];
      lds4_float(s.Xr + r * ldx + d, x), lds4_float(s.Qr + r * ldx + d, q);
      const float f = s.bet[r] * s.rk[r];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 g = gated_kq<S>(x[j], q[j], s.rk[r], s.rq[r], b[j], be[j]);
        kg[j] = g.x, qg[j] = g.y;
        y[j] = operand_store<S>(x[j] * (f * exp2_approx<S>(b[j])));
      }
      const int64_t o = (int64_t(ck.t0 + r) * p.HV + hv) * p.K + sl.c0 + d;
      *reinterpret_cast<float4*>(p.qg + o) = make_float4(qg[0], qg[1], qg[2], qg[3]);
      if (!p.kg_t) *reinterpret_cast<float4*>(p.kg + o) = make_float4(kg[0], kg[1], kg[2], kg[3]);
    }
    if constexpr (sizeof(Tin) == 2)
      if (p.kg_t) {  // kg's high and low halves (0 past L)
        uint32_t h[2], l[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          h[j] = __byte_perm(__float_as_uint(kg[2 * j]), __float_as_uint(kg[2 * j + 1]), 0x7632);
          l[j] = __byte_perm(__float_as_uint(kg[2 * j]), __float_as_uint(kg[2 * j + 1]), 0x5410);
        }
        *reinterpret_cast<uint2*>(s.Xr + r * ldx + d) = make_uint2(h[0], h[1]);
        *reinterpret_cast<uint2*>(s.Qr + r * ldx + d) = make_uint2(l[0], l[1]);
      }
    *reinterpret_cast<float4*>(s.F + r * kLdF + d) = make_float4(y[0], y[1], y[2], y[3]);
  }
}

// The slab's right-hand side Y = x * factor into F (rows >= L zero), stored TF32-rounded unless the
// products are split, so that the product loop loads each B element once and converts nothing:
// factor = beta rk 2^b per row (gdn, w), beta per row (u), beta rk 2^(b_r[d]) per element (kda, w:
// build_gated_rhs). Four columns per thread, 16 threads per row, as build_gated_rhs (a thread per
// element had cost 12% of the stall samples, short scoreboard on its 2-byte loads).
template <bool S, class Tin, bool kKDA>
__device__ void build_rhs(const ChunkParams& p, const ChunkInfo& ck, int hv, const Slab& sl, const WySmem<Tin, kKDA>& s) {
  constexpr int ldx = WySmem<Tin, kKDA>::ldx;
  const int L = ck.len;
  const bool per_elem = kKDA && sl.is_w;
  for (int r = threadIdx.x; r < kChunk; r += kThreads)
    s.fr[r] = sl.is_w ? (kKDA ? 0.0f : s.bet[r] * s.rk[r] * exp2f(s.gs[r])) : s.bet[r];
  if (per_elem)  // row L - 1 of the gates is kept before Y overwrites it
    for (int c = threadIdx.x; c < sl.W; c += kThreads) s.be[c] = s.F[(L - 1) * kLdF + c];
  __syncthreads();
  if constexpr (kKDA)
    if (per_elem) return build_gated_rhs<S>(p, ck, hv, sl, s);
  const int d = 4 * int(threadIdx.x % 16);
  if (d >= sl.W) return;
#pragma unroll 4
  for (int r = int(threadIdx.x) / 16; r < kChunk; r += kThreads / 16) {
    float y[4] = {};
    if (r < L) {
      lds4_float(s.Xr + r * ldx + d, y);
#pragma unroll
      for (int j = 0; j < 4; ++j) y[j] = operand_store<S>(y[j] * s.fr[r]);
    }
    *reinterpret_cast<float4*>(s.F + r * kLdF + d) = make_float4(y[0], y[1], y[2], y[3]);
  }
}

// kg^T of the slab's channels (bits left in Xr, Qr by build_rhs) into kg_t [NT,HV,K,64], 64 contiguous
// floats per channel, and 2^(b_end) of each channel into kg_decay at the transposed chain's position
// (chunk_state_kda.cuh kda_decay_pos). A warp takes 32 channels x 16 rows per pass: lane l a channel
// pair (one 32-bit load of Xr and of Qr per row gives both) and rows 4 (l / 16) + {0..3, 8..11}, so
// its two 16-byte stores per channel and lane 16 + l's fill whole 32-byte sectors, and a row's loads
// by lanes l and 16 + l fall 144 words apart (different banks). It had been a warp per channel, two
// 4-byte stores and four 2-byte loads per lane (ncu: 16% of the kernel's instructions).
template <class Tin, bool kKDA>
__device__ void store_kg_t(const ChunkParams& p, int ci, int hv, const Slab& sl, const WySmem<Tin, kKDA>& s) {
  constexpr int ldw = WySmem<Tin, kKDA>::ldx / 2;  // Xr, Qr rows in 32-bit words (two channels each)
  const int lane = int(threadIdx.x & 31), c = 2 * (lane & 15), rq = 4 * (lane >> 4);
  float* out = p.kg_t + ((int64_t(ci) * p.HV + hv) * p.K + sl.c0) * kChunk;
  const uint32_t* hi = reinterpret_cast<const uint32_t*>(s.Xr);
  const uint32_t* lo = reinterpret_cast<const uint32_t*>(s.Qr);
  for (int pass = int(threadIdx.x >> 5); pass < (kSlab / 32) * (kChunk / 16); pass += kThreads / 32) {
    const int d = 32 * (pass % (kSlab / 32)) + c, r0 = 16 * (pass / (kSlab / 32)) + rq;
    if (d >= sl.W) continue;
    float a[8], b[8];  // channels d, d + 1 at rows r0 + {0..3, 8..11}
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int w = (r0 + j % 4 + 8 * (j / 4)) * ldw + d / 2;
      a[j] = __uint_as_float(__byte_perm(lo[w], hi[w], 0x5410));
      b[j] = __uint_as_float(__byte_perm(lo[w], hi[w], 0x7632));
    }
    float4* oa = reinterpret_cast<float4*>(out + d * kChunk + r0);
    float4* ob = reinterpret_cast<float4*>(out + (d + 1) * kChunk + r0);
    oa[0] = make_float4(a[0], a[1], a[2], a[3]), oa[2] = make_float4(a[4], a[5], a[6], a[7]);
    ob[0] = make_float4(b[0], b[1], b[2], b[3]), ob[2] = make_float4(b[4], b[5], b[6], b[7]);
  }
  for (int d = int(threadIdx.x); d < sl.W; d += kThreads)
    p.kg_decay[(int64_t(ci) * p.HV + hv) * p.K + kda_decay_pos(sl.c0 + d, p.K)] = exp2f(s.be[d]);
}

template <class Tin, bool kKDA>
__global__ void __launch_bounds__(kThreads) chunk_wy_kernel(const ChunkParams p) {
  constexpr bool S = kSplitProducts<Tin>;
  using Sm = WySmem<Tin, kKDA>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const int ci = int(blockIdx.y) + p.c_off, hv = blockIdx.z, m0 = 16 * (threadIdx.x >> 5);
  const ChunkInfo ck = chunk_at(p, ci);
  const Slab sl = slab_of(p, blockIdx.x);
  if (sl.W == kSlab) load_slab<kSlab>(p, ck, ci, hv, sl, s);
  else load_slab<0>(p, ck, ci, hv, sl, s);
  __syncthreads();
  build_rhs<S>(p, ck, hv, sl, s);
  __syncthreads();
  if constexpr (kKDA && sizeof(Tin) == 2)
    if (sl.is_w && p.kg_t) store_kg_t(p, ci, hv, sl, s);
  float acc[kSlab / 8][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < min(ck.len, m0 + 16); k0 += 8) {  // P is lower triangular: columns > m0 + 15 of its rows are 0
    const FragA<S> fa = ldm_a_row<S>(s.Ps, kLdP, m0, k0, true);
#pragma unroll
    for (int nt = 0; nt < kSlab / 8; ++nt) {
      if (8 * nt >= sl.W) continue;
      mma(acc[nt], fa, load_b<S, true>([&](int r, int d) { return s.F[r * kLdF + d]; }, k0, 8 * nt));
    }
  }
  float* out = sl.is_w ? p.w : p.u;
#pragma unroll
  for (int nt = 0; nt < kSlab / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = acc_row(m0, e), c = acc_col(8 * nt, e);
      if (r < ck.len && c < sl.W) {
        const float a = sl.is_w ? operand_store<S>(acc[nt][e]) : acc[nt][e];
        const float b = sl.is_w ? operand_store<S>(acc[nt][e + 1]) : acc[nt][e + 1];
        *reinterpret_cast<float2*>(out + (int64_t(ck.t0 + r) * p.HV + hv) * sl.D + sl.c0 + c) = make_float2(a, b);
      }
    }
}

template <class Tin, bool kKDA>
void launch(const ChunkParams& p, cudaStream_t stream, bool with_u) {
  const size_t smem = WySmem<Tin, kKDA>::bytes;
  const int slabs = (p.K + kSlab - 1) / kSlab + (with_u ? (p.V + kSlab - 1) / kSlab : 0);  // w slabs first (slab_of)
  launch_kernel(chunk_wy_kernel<Tin, kKDA>, dim3(slabs, front_chunks(p), p.HV), kThreads, smem, stream, p);
}

}  // namespace

void launch_chunk_wy(const ChunkParams& p, int input_dtype, cudaStream_t stream, bool with_u) {
  if (front_chunks(p) <= 0 || p.gla) return;  // gla: no w, u; kg, qg come from the kkt stage
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    if (p.kda) launch<Tin, true>(p, stream, with_u);
    else launch<Tin, false>(p, stream, with_u);
  });
}

}  // namespace kcp::cuda
