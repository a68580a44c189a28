// Stage "state recurrence + output" for gdn with 16-bit q, k, v and the WY products folded in
// (ALGORITHMS.md 4.3: u - w S = P (beta (v - Gamma k S))). Per chunk c of L rows, S entering it:
//   X_s  = rk_s k_s @ S                        [64,BV]  (raw k: exact TF32 operands)
//   Y_s  = beta_s (v_s - 2^(b_s) X_s)          rows >= L are 0 (beta = 0 there)
//   vnew = P_c @ Y                             = u - w S of the unfolded pipeline
//   o_r  = scale 2^(b_r) rq_r (q_r @ S) + sum_{s<=r} Aqk[r,s] vnew_s
//   S    = 2^(b_{L-1}) S + k_c^T @ (vnew_s 2^(b_{L-1} - b_s) rk_s)
// One block per (sequence n, value head hv, BV = 16 G state columns): G groups of 4 warps, group
// gamma owning 16 columns, warp wg of a group owning key rows [wg K/4, (wg+1) K/4). Products run
// transposed (state columns as the M dimension), so S^T [16,K/4] stays in registers as mma.sync
// (TF32) accumulators, and an accumulator tile is itself the A fragment of the next product once
// the k index is permuted (fragment position t <-> column 2t, t+4 <-> 2t+1; B fragments are read
// under the same permutation: 16-bit pairs by ldmatrix, float pairs by 8-byte loads). S, Y and vnew
// never leave registers; the partial sums of k @ S and q @ S over the group's 4 key slices meet
// once per chunk in shared memory (one group barrier); Y and P @ Y are formed by each warp of the
// group (identical operands, identical order: identical values).
// Tiles of chunk c+1 (k, q, v columns, lower 8x8 blocks of P and Aqk, gates) load by cp.async
// while chunk c computes. Rows >= L of k, q, v are zero-filled.
// Covered by tests/cuda/test_cuda_stages.cpp ("state", G = 1 and 2) and test_cuda_forward.cpp.
#include "cuda/chunk_state_fold.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdT = 72;  // float tiles P, Aqk [64][72]: 8-byte fragment loads conflict-free per half-warp

constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

template <class Tin, int KD, int G>
struct FoldSmem {
  static constexpr int kThreads = 128 * G, BV = 16 * G;
  static constexpr int ldk = KD + 8, ldv = BV + 8;  // 16-bit rows: ldmatrix rows on distinct bank groups
  static constexpr size_t bytes_k = align16(2 * kChunk * ldk), bytes_v = align16(2 * kChunk * ldv),
                          bytes_t = 4 * kChunk * kLdT, bytes_g = 4 * 4 * kChunk;
  static constexpr size_t bytes_stage = 2 * bytes_k + bytes_v + 2 * bytes_t + bytes_g;
  static constexpr size_t bytes_red = 16 * size_t(G) * 4 * 16 * 32;  // [G][4 warps][16 tiles][32 lanes] float4
  static constexpr size_t bytes_fac = 4 * size_t(G) * 3 * kChunk;    // [G][fb, E, f][64]
  static constexpr size_t bytes = 2 * bytes_stage + bytes_red + bytes_fac;
  char* base;
  __device__ explicit FoldSmem(char* b) : base(b) {}
  __device__ char* stage(int st) const { return base + st * bytes_stage; }
  __device__ Tin* Ks(int st) const { return reinterpret_cast<Tin*>(stage(st)); }
  __device__ Tin* Qs(int st) const { return reinterpret_cast<Tin*>(stage(st) + bytes_k); }
  __device__ Tin* Vs(int st) const { return reinterpret_cast<Tin*>(stage(st) + 2 * bytes_k); }
  __device__ float* Ps(int st) const { return reinterpret_cast<float*>(stage(st) + 2 * bytes_k + bytes_v); }
  __device__ float* As(int st) const { return Ps(st) + kChunk * kLdT; }
  // gates of the chunk: 0 b (log2 cumsum), 1 beta, 2 rstd_k, 3 rstd_q
  __device__ float* gate(int st, int a) const { return As(st) + kChunk * kLdT + a * kChunk; }
  __device__ float4* red() const { return reinterpret_cast<float4*>(base + 2 * bytes_stage); }
  // per-row factors of the chunk, per group: 0 fb = beta 2^b rk, 1 E = 2^(b_{L-1}-b) rk, 2 f = scale 2^b rq
  __device__ float* fac(int grp, int a) const {
    return reinterpret_cast<float*>(base + 2 * bytes_stage + bytes_red) + (grp * 3 + a) * kChunk;
  }
};

// 16-byte copies of 64 rows x kBytes (row r at src + r * stride elements); rows >= L zero-filled.
template <int kThreads, int kBytes, class T>
__device__ __forceinline__ void copy_rows(T* dst, int ld, int L, const T* src, int stride) {
  constexpr int segs = kBytes / 16, per = 16 / int(sizeof(T)), total = kChunk * segs;
  constexpr int n = (total + kThreads - 1) / kThreads;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads, r = idx / segs, sg = idx % segs;
    if (total % kThreads != 0 && idx >= total) break;
    const bool valid = r < L;
    cp_async16(dst + r * ld + sg * per, src + (valid ? r * stride : 0) + sg * per, valid);
  }
}

// The 8x8 blocks on and below the diagonal of a 64x64 float tile (the only ones the products read).
template <int kThreads>
__device__ __forceinline__ void copy_lower_tile(float* dst, const float* src) {
#pragma unroll
  for (int i = 0; i < kChunk * 16 / kThreads; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads, r = idx >> 4, sg = idx & 15;
    if (sg < 2 * ((r >> 3) + 1)) cp_async16(dst + r * kLdT + 4 * sg, src + r * kChunk + 4 * sg, true);
  }
}

template <class Sm>
__device__ void issue_loads(const StateParams& sp, const ChunkInfo& ck, int ci, int hv, int v0, int st, const Sm& s) {
  using Tin = std::remove_pointer_t<decltype(s.Ks(0))>;
  constexpr int KD = Sm::ldk - 8, NT = Sm::kThreads;
  const ChunkParams& p = sp.c;
  const int h = hv / p.G, L = ck.len;
  copy_rows<NT, 2 * KD>(s.Ks(st), Sm::ldk, L, static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0, h), int(p.k.st));
  copy_rows<NT, 2 * KD>(s.Qs(st), Sm::ldk, L, static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0, h), int(p.q.st));
  copy_rows<NT, 2 * Sm::BV>(s.Vs(st), Sm::ldv, L, static_cast<const Tin*>(p.v.p) + row_off(p.v, ck.t0, hv) + v0,
                            int(p.v.st));
  const int64_t tile = (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
  copy_lower_tile<NT>(s.Ps(st), p.P + tile);
  copy_lower_tile<NT>(s.As(st), p.Aqk + tile);
  const int r = threadIdx.x & 63, half = threadIdx.x >> 6;  // threads 0-63: b, beta; 64-127: rstd
  const bool valid = r < L;
  const int64_t tt = ck.t0 + (valid ? r : 0);
  if (half == 0) {
    cp_async4(s.gate(st, 0) + r, p.gcum + tt * p.HV + hv, valid);
    cp_async4(s.gate(st, 1) + r, p.beta_e + tt * p.HV + hv, valid);
  } else if (half == 1 && p.l2norm) {
    cp_async4(s.gate(st, 2) + r, p.rstd_k + tt * p.H + h, valid);
    cp_async4(s.gate(st, 3) + r, p.rstd_q + tt * p.H + h, valid);
  }
}

// fb, E, f of the chunk's rows for this thread's group (its first 64 threads).
template <class Sm>
__device__ void chunk_factors(const ChunkParams& p, int L, int st, int grp, const Sm& s) {
  const int r = int(threadIdx.x) - 128 * grp;
  if (r >= kChunk) return;
  const float b = s.gate(st, 0)[r], b_end = s.gate(st, 0)[L - 1];
  const float rk = p.l2norm ? s.gate(st, 2)[r] : 1.0f, rq = p.l2norm ? s.gate(st, 3)[r] : 1.0f;
  const float gam = exp2f(b);
  s.fac(grp, 0)[r] = s.gate(st, 1)[r] * gam * rk;
  s.fac(grp, 1)[r] = r < L ? exp2f(b_end - b) * rk : 0.0f;
  s.fac(grp, 2)[r] = p.scale * gam * rq;
}

__device__ __forceinline__ void mma_raw(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  mma_tf32(c, a, b);
}

// A fragment (permuted k order) from an accumulator tile, rounded to TF32, each value times f(column).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[4], float f_even = 1.0f, float f_odd = 1.0f) {
  a[0] = tf32_bits(c[0] * f_even), a[1] = tf32_bits(c[2] * f_even);
  a[2] = tf32_bits(c[1] * f_odd), a[3] = tf32_bits(c[3] * f_odd);
}

// Partial X^T = S^T k^T and (q S)^T over this warp's key rows: [16 x 64] each, n-tile m = rows 8m..8m+7.
template <class Tin, int KD>
__device__ void products_with_state(const Tin* Ks, const Tin* Qs, int ld, int i0, const float (&ST)[KD / 32][4],
                                    float (&X)[8][4], float (&QX)[8][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < KD / 32; ++j) {
    uint32_t a[4];
    acc_to_a(a, ST[j]);
#pragma unroll
    for (int mq = 0; mq < 2; ++mq) {
      uint32_t rk[4], rq[4];
      ldsm_x4(rk, Ks + (32 * mq + lane) * ld + i0 + 8 * j);
      ldsm_x4(rq, Qs + (32 * mq + lane) * ld + i0 + 8 * j);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        mma_raw(X[4 * mq + x], a, widen_lo<Tin>(rk[x]), widen_hi<Tin>(rk[x]));
        mma_raw(QX[4 * mq + x], a, widen_lo<Tin>(rq[x]), widen_hi<Tin>(rq[x]));
      }
    }
  }
}

// Y^T = beta v^T - fb X^T for the group's 16 columns (all 64 rows), as A fragments of P @ Y.
template <class Tin, class Sm>
__device__ void form_y(const Sm& s, int st, int grp, const float (&X)[8][4], uint32_t (&ya)[8][4]) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  const float* bet = s.gate(st, 1);
  const float* fb = s.fac(grp, 0);
#pragma unroll
  for (int mp = 0; mp < 4; ++mp) {  // v rows 16mp..16mp+15, both 8-column halves: one ldmatrix.trans
    uint32_t vr[4];
    const int x = lane >> 3;
    ldsm_x4_trans(vr, s.Vs(st) + (8 * (2 * mp + (x >> 1)) + (lane & 7)) * Sm::ldv + 16 * grp + 8 * (x & 1));
#pragma unroll
    for (int hm = 0; hm < 2; ++hm) {
      const int m = 2 * mp + hm;
      const float2 b2 = *reinterpret_cast<const float2*>(bet + 8 * m + 2 * t);
      const float2 f2 = *reinterpret_cast<const float2*>(fb + 8 * m + 2 * t);
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t w = vr[2 * hm + (e >> 1)];
        const float v = __uint_as_float((e & 1) ? widen_hi<Tin>(w) : widen_lo<Tin>(w));
        y[e] = (e & 1) ? b2.y * v - f2.y * X[m][e] : b2.x * v - f2.x * X[m][e];
      }
      acc_to_a(ya[m], y);
    }
  }
}

// Sums the 4 warps' partials of tile q (fixed order, so every warp gets the same value).
__device__ __forceinline__ float4 sum_partials(const float4* red, int grp, int q) {
  const int lane = threadIdx.x & 31;
  float4 acc = red[((grp * 4 + 0) * 16 + q) * 32 + lane];
#pragma unroll
  for (int w = 1; w < 4; ++w) {
    const float4 x = red[((grp * 4 + w) * 16 + q) * 32 + lane];
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
  }
  return acc;
}

template <class To>
__device__ void store_o(const StateParams& sp, const ChunkInfo& ck, int hv, int vg, int m, const float (&o)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  To* dst = static_cast<To*>(sp.o.p) + int64_t(ck.t0) * sp.o.st + int64_t(hv) * sp.o.sx + vg + g;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = 8 * m + 2 * t + (e & 1);
    if (r < ck.len) dst[int64_t(r) * sp.o.st + 8 * (e >> 1)] = from_float<To>(o[e]);
  }
}

// Output rows 16 wg .. 16 wg + 15 of the group's columns: f_r (q S)_r + sum_{s<=r} Aqk[r,s] vnew_s.
template <class Sm>
__device__ void output_rows(const StateParams& sp, const ChunkInfo& ck, int hv, int vg, int st, int grp, const Sm& s,
                            const float (&VN)[8][4]) {
  const int warp = threadIdx.x >> 5, wg = warp & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* At = s.As(st);
#pragma unroll
  for (int hm = 0; hm < 2; ++hm) {
    const int m = 2 * wg + hm;
    const float4 qs = sum_partials(s.red(), grp, 8 + m);
    const float2 f2 = *reinterpret_cast<const float2*>(s.fac(grp, 2) + 8 * m + 2 * t);
    float o[4] = {qs.x * f2.x, qs.y * f2.y, qs.z * f2.x, qs.w * f2.y};
#pragma unroll
    for (int mk = 0; mk < 8; ++mk) {
      if (mk > m) continue;
      uint32_t a[4];
      acc_to_a(a, VN[mk]);
      const float2 b = *reinterpret_cast<const float2*>(At + (8 * m + g) * kLdT + 8 * mk + 2 * t);
      mma_raw(o, a, __float_as_uint(b.x), __float_as_uint(b.y));
    }
    switch (sp.o.dt) {
      case kBF16: store_o<__nv_bfloat16>(sp, ck, hv, vg, m, o); break;
      case kF16: store_o<__half>(sp, ck, hv, vg, m, o); break;
      case kF64: store_o<double>(sp, ck, hv, vg, m, o); break;
      default: store_o<float>(sp, ck, hv, vg, m, o); break;
    }
  }
}

// S^T = 2^(b_{L-1}) S^T + (vnew E)^T k over this warp's key rows.
template <class Tin, int KD, class Sm>
__device__ void update_state(const Sm& s, int st, int grp, int L, int i0, const float (&VN)[8][4], float (&ST)[KD / 32][4]) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  const float decay = exp2f(s.gate(st, 0)[L - 1]);
#pragma unroll
  for (int j = 0; j < KD / 32; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) ST[j][e] *= decay;
  uint32_t va[8][4];
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const float2 e2 = *reinterpret_cast<const float2*>(s.fac(grp, 1) + 8 * m + 2 * t);
    acc_to_a(va[m], VN[m], e2.x, e2.y);
  }
  const Tin* Ks = s.Ks(st);
#pragma unroll
  for (int j = 0; j < KD / 32; ++j)
#pragma unroll
    for (int mq = 0; mq < 2; ++mq) {
      uint32_t rk[4];
      ldsm_x4_trans(rk, Ks + (32 * mq + lane) * Sm::ldk + i0 + 8 * j);
#pragma unroll
      for (int x = 0; x < 4; ++x) mma_raw(ST[j], va[4 * mq + x], widen_lo<Tin>(rk[x]), widen_hi<Tin>(rk[x]));
    }
}

// Stage tests only: h[c] (state entering the chunk) and vnew (rows of this warp's output slice).
template <int KD>
__device__ void write_stage_results(const StateParams& sp, const ChunkInfo& ck, int c, int hv, int vg, int i0,
                                    const float (&ST)[KD / 32][4], const float (&VN)[8][4], bool state_part) {
  const ChunkParams& p = sp.c;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wg = (threadIdx.x >> 5) & 3;
  if (state_part) {
#pragma unroll
    for (int j = 0; j < KD / 32; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + 8 * j + 2 * t + (e & 1), v = vg + g + 8 * (e >> 1);
        sp.h[((int64_t(c) * p.HV + hv) * KD + i) * sp.Vw + v] = ST[j][e];
      }
    return;
  }
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    if ((m >> 1) != wg) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 8 * m + 2 * t + (e & 1), v = vg + g + 8 * (e >> 1);
      if (r < ck.len) sp.vnew[(int64_t(ck.t0 + r) * p.HV + hv) * sp.Vw + v] = VN[m][e];
    }
  }
}

template <int KD>
__device__ void load_initial_state(const StateParams& sp, int n, int hv, int vg, int i0, float (&ST)[KD / 32][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const StateView& h0 = sp.h0;
#pragma unroll
  for (int j = 0; j < KD / 32; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + 8 * j + 2 * t + (e & 1), v = vg + g + 8 * (e >> 1);
      ST[j][e] = sp.init == kInitGiven ? load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + i * h0.si + v * h0.sj) : 0.0f;
    }
}

template <class Tin, int KD, int G>
__global__ void __launch_bounds__(128 * G, 1) chunk_state_fold_kernel(const StateParams sp) {
  using Sm = FoldSmem<Tin, KD, G>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const int warp = threadIdx.x >> 5, grp = warp >> 2, wg = warp & 3, lane = threadIdx.x & 31;
  const int v0 = blockIdx.x * Sm::BV, vg = v0 + 16 * grp, i0 = wg * (KD / 4);
  const int n = blockIdx.y / p.HV, hv = blockIdx.y % p.HV;
  const int c_begin = p.seq_chunk0[n], c_end = p.seq_chunk0[n + 1];
  float ST[KD / 32][4];
  load_initial_state<KD>(sp, n, hv, vg, i0, ST);
  ChunkInfo ck = c_begin < c_end ? p.chunks[c_begin] : ChunkInfo{};
  if (c_begin < c_end) issue_loads(sp, ck, c_begin, hv, v0, 0, s);
  cp_async_commit();
  for (int c = c_begin; c < c_end; ++c) {
    const int st = (c - c_begin) & 1;
    const ChunkInfo next = c + 1 < c_end ? p.chunks[c + 1] : ck;  // used after the first products
    cp_async_wait<0>();
    __syncthreads();  // chunk c's tiles landed; chunk c-1 done by all (its buffers, red, fac free)
    if (sp.h) write_stage_results<KD>(sp, ck, c, hv, vg, i0, ST, {}, true);
    chunk_factors(p, ck.len, st, grp, s);
    float X[8][4] = {}, QX[8][4] = {};
    products_with_state<Tin, KD>(s.Ks(st), s.Qs(st), Sm::ldk, i0, ST, X, QX);
    if (c + 1 < c_end) issue_loads(sp, next, c + 1, hv, v0, st ^ 1, s);
    cp_async_commit();
    float4* red = s.red() + (grp * 4 + wg) * 16 * 32 + lane;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      red[m * 32] = make_float4(X[m][0], X[m][1], X[m][2], X[m][3]);
      red[(8 + m) * 32] = make_float4(QX[m][0], QX[m][1], QX[m][2], QX[m][3]);
    }
    asm volatile("bar.sync %0, 128;" ::"r"(1 + grp) : "memory");  // the group's partials and factors
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float4 x = sum_partials(s.red(), grp, m);
      X[m][0] = x.x, X[m][1] = x.y, X[m][2] = x.z, X[m][3] = x.w;
    }
    uint32_t ya[8][4];
    form_y<Tin>(s, st, grp, X, ya);
    float VN[8][4] = {};
    const float* Pt = s.Ps(st);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mk = 0; mk < 8; ++mk)  // vnew^T = Y^T P^T; P is lower triangular
#pragma unroll
      for (int m = mk; m < 8; ++m) {
        const float2 b = *reinterpret_cast<const float2*>(Pt + (8 * m + g) * kLdT + 8 * mk + 2 * t);
        mma_raw(VN[m], ya[mk], __float_as_uint(b.x), __float_as_uint(b.y));
      }
    if (sp.vnew) write_stage_results<KD>(sp, ck, c, hv, vg, i0, ST, VN, false);
    update_state<Tin, KD>(s, st, grp, ck.len, i0, VN, ST);
    if (sp.o.p) output_rows(sp, ck, hv, vg, st, grp, s, VN);
    ck = next;
  }
  const StateView& f = sp.final_state;
  if (f.p) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < KD / 32; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + 8 * j + 2 * t + (e & 1), v = vg + g + 8 * (e >> 1);
        store_any(f.p, f.dt, n * f.sn + hv * f.shv + i * f.si + v * f.sj, ST[j][e]);
      }
  }
}

template <class Tin, int KD, int G>
void launch(const StateParams& sp, cudaStream_t stream) {
  using Sm = FoldSmem<Tin, KD, G>;
  static_assert(Sm::bytes <= 227 * 1024, "folded state tiles exceed shared memory");
  auto kernel = chunk_state_fold_kernel<Tin, KD, G>;
  KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Sm::bytes)));
  kernel<<<dim3(sp.c.V / Sm::BV, sp.c.N * sp.c.HV), Sm::kThreads, Sm::bytes, stream>>>(sp);
  KCP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_chunk_state_fold(const StateParams& sp, int input_dtype, int groups, cudaStream_t stream) {
  const ChunkParams& p = sp.c;
  KCP_CHECK(state_fold_applies(p, input_dtype) && sp.Vw == p.V && sp.u == p.u && sp.init != kInitIdentity &&
                p.V % 32 == 0 && groups >= 0 && groups <= 2,
            "cuda-chunkwise: the folded state kernel serves the gdn forward with 16-bit inputs only");
  if (p.N * p.HV == 0) return;
  static int sms = 0;
  if (!sms) KCP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int G = groups ? groups : (int64_t(p.V / 16) * p.N * p.HV <= sms ? 1 : 2);
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    if constexpr (sizeof(Tin) == 2)
      dispatch_key_dim(p.K, [&](auto kd) {
        constexpr int KD = decltype(kd)::value;
        if (G == 1) launch<Tin, KD, 1>(sp, stream);
        else launch<Tin, KD, 2>(sp, stream);
      });
  });
}

}  // namespace kcp::cuda
