// Stage "state recurrence" (+ fused output): one block of 4 warps per (sequence n, value head hv,
// 32 state columns [v0, v0+32)), walking the chunks of n in order with the state S [K,32] in
// registers (float32, tensor-core accumulator layout). Per chunk c with L valid rows:
//   h[c] = S                                         (stage tests only)
//   vnew = u_c - w_c @ S                    [L,32]   (rows >= L are 0)
//   o_c  = scale * Gamma ⊙ (q_c @ S) + Aqk_c @ vnew  (gdn: Gamma_r = 2^b_r; kda: q_c = qg_c, Gamma = 1)
//   S    = Gamma_end ⊙ S + kt_c^T @ vt_c             gdn: kt = k, vt_r = vnew_r * 2^(b_end - b_r)
//                                                    kda: kt = kg (pre-gated), vt = vnew, Gamma_end per row of S
// Tiles arrive by cp.async in two groups so the next chunk's loads overlap this chunk's products:
//   group A = {w, u, q, gates} is refilled as soon as vnew is formed, group B = {k, Aqk} at the end.
// The same kernel gives the CP transition: S_ext with init 0, and M with u = 0, init = I, Vw = K.
// Covered by tests/cuda/test_cuda_stages.cpp ("state"), test_cuda_forward.cpp (fused path) and
// test_cuda_transition.cpp.
#include "cuda/chunk_state.cuh"

#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 128, kBV = kValueTile, kLdV = kBV + 8, kLdA = 68;

constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

template <class Tin, int KD, bool kKDA>
struct StateSmem {
  using KT = std::conditional_t<kKDA, float, Tin>;  // element type of the k and q tiles
  static constexpr int ldw = KD + 4, ldk = ld_col<KT>(KD), ldq = ld_row<KT>(KD);
  static constexpr int gates = kKDA ? 2 * KD : 3 * 2 * kChunk;  // kda: b_end [2][K]; gdn: b, rq, rk [2][64]
  static constexpr size_t bytes_w = align16(4 * kChunk * ldw), bytes_u = align16(4 * kChunk * kLdV),
                          bytes_q = align16(sizeof(KT) * kChunk * ldq), bytes_k = align16(sizeof(KT) * kChunk * ldk),
                          bytes_a = align16(4 * kChunk * kLdA), bytes_s = align16(4 * KD * kLdV),
                          bytes_v = align16(4 * kChunk * kLdV), bytes_g = align16(4 * gates);
  static constexpr size_t bytes = bytes_w + bytes_u + bytes_q + bytes_k + bytes_a + bytes_s + 2 * bytes_v + bytes_g;
  float *Ws, *Us, *As, *Ss, *VN, *VE, *G;
  KT *Qs, *Kt;
  __device__ explicit StateSmem(char* b) {
    Ws = reinterpret_cast<float*>(b), b += bytes_w;
    Us = reinterpret_cast<float*>(b), b += bytes_u;
    Qs = reinterpret_cast<KT*>(b), b += bytes_q;
    Kt = reinterpret_cast<KT*>(b), b += bytes_k;
    As = reinterpret_cast<float*>(b), b += bytes_a;
    Ss = reinterpret_cast<float*>(b), b += bytes_s;
    VN = reinterpret_cast<float*>(b), b += bytes_v;
    VE = reinterpret_cast<float*>(b), b += bytes_v;
    G = reinterpret_cast<float*>(b);
  }
  // gdn gate rows of buffer `buf`: b (log2 cumsum), rq, rk (rstd of q, k)
  __device__ float* gb(int buf) const { return G + buf * kChunk; }
  __device__ float* rq(int buf) const { return G + 2 * kChunk + buf * kChunk; }
  __device__ float* rk(int buf) const { return G + 4 * kChunk + buf * kChunk; }
  __device__ float* bend(int buf) const { return G + buf * KD; }  // kda: b of the last row, per channel
};

// 16-byte copies of `rows` x `bytes_per_row` from a row source; rows >= L are zero-filled.
template <class T, class RowPtr>
__device__ void copy_rows(T* dst, int ld, int bytes_per_row, int L, RowPtr&& row_ptr) {
  const int segs = bytes_per_row / 16, per = 16 / int(sizeof(T));
  for (int idx = threadIdx.x; idx < kChunk * segs; idx += kThreads) {
    const int r = idx / segs, sg = idx % segs;
    const bool valid = r < L;
    const T* src = row_ptr(valid ? r : 0);
    cp_async16(dst + r * ld + sg * per, src + sg * per, valid);
  }
}

template <class Tin, int KD, bool kKDA>
__device__ void issue_group_a(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int buf,
                              const StateSmem<Tin, KD, kKDA>& s) {
  using Sm = StateSmem<Tin, KD, kKDA>;
  const ChunkParams& p = sp.c;
  const int h = hv / p.G, L = ck.len;
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;  // (token, head) row index of the chunk's first row
  copy_rows(s.Ws, Sm::ldw, 4 * KD, L, [&](int r) { return p.w + (row0 + int64_t(r) * p.HV) * KD; });
  if (sp.u) copy_rows(s.Us, kLdV, 4 * kBV, L, [&](int r) { return sp.u + (row0 + int64_t(r) * p.HV) * sp.Vw + v0; });
  if (sp.o.p) {
    if constexpr (kKDA)
      copy_rows(s.Qs, Sm::ldq, 4 * KD, L, [&](int r) { return p.qg + (row0 + int64_t(r) * p.HV) * KD; });
    else
      copy_rows(s.Qs, Sm::ldq, int(sizeof(Tin)) * KD, L,
                [&](int r) { return static_cast<const Tin*>(p.q.p) + row_off(p.q, ck.t0 + r, h); });
  }
  if constexpr (kKDA) {
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

template <class Tin, int KD, bool kKDA>
__device__ void issue_group_b(const StateParams& sp, const ChunkInfo& ck, int ci, int hv, const StateSmem<Tin, KD, kKDA>& s) {
  using Sm = StateSmem<Tin, KD, kKDA>;
  const ChunkParams& p = sp.c;
  const int L = ck.len;
  const int64_t row0 = int64_t(ck.t0) * p.HV + hv;
  if constexpr (kKDA)
    copy_rows(s.Kt, Sm::ldk, 4 * KD, L, [&](int r) { return p.kg + (row0 + int64_t(r) * p.HV) * KD; });
  else
    copy_rows(s.Kt, Sm::ldk, int(sizeof(Tin)) * KD, L,
              [&](int r) { return static_cast<const Tin*>(p.k.p) + row_off(p.k, ck.t0 + r, hv / p.G); });
  if (sp.o.p) {
    const float* a = p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk;
    copy_rows(s.As, kLdA, 4 * kChunk, kChunk, [&](int r) { return a + r * kChunk; });
  }
}

// Which accumulator tiles of S a warp owns: m-tiles wm + WM*i, n-tiles wn*NTW + j.
template <int KD>
struct StateTiling {
  static constexpr int MT = KD / 16, NT8 = kBV / 8, WM = MT < 4 ? MT : 4, WN = 4 / WM;
  static constexpr int MTW = MT / WM, NTW = NT8 / WN;
  __device__ static int m0(int i) { return 16 * ((threadIdx.x >> 5) % WM + WM * i); }
  __device__ static int n0(int j) { return 8 * (((threadIdx.x >> 5) / WM) * NTW + j); }
};

template <int KD, class F>
__device__ void for_state_elems(F&& f) {
  using Tl = StateTiling<KD>;
#pragma unroll
  for (int i = 0; i < Tl::MTW; ++i)
#pragma unroll
    for (int j = 0; j < Tl::NTW; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(i, j, e, acc_row(Tl::m0(i), e), acc_col(Tl::n0(j), e));
}


template <class Tin, int KD, bool kKDA>
using StateRegs = float[StateTiling<KD>::MTW][StateTiling<KD>::NTW][4];

// av = w @ S and ao = q @ S for this warp's 16 rows (both share the B fragments of S).
template <bool kSplit, class Tin, int KD, bool kKDA>
__device__ void products_w_q(const StateSmem<Tin, KD, kKDA>& s, int mw, bool out, float (&av)[kBV / 8][4],
                             float (&ao)[kBV / 8][4]) {
  using Sm = StateSmem<Tin, KD, kKDA>;
  constexpr bool S = kSplit;
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    const FragA<S> fw = load_a_row<S>(s.Ws, Sm::ldw, mw, k0);
    FragA<S> fq{};
    if (out) fq = load_a_row<S>(s.Qs, Sm::ldq, mw, k0);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) {
      const FragB<S> fb = load_b_kn<S>(s.Ss, kLdV, k0, 8 * nt);
      mma(av[nt], fw, fb);
      if (out) mma(ao[nt], fq, fb);
    }
  }
}

// vnew = u - w S into VN (and, gdn, vnew * 2^(b_end - b_r) * rstd_k into VE); rows >= L are zero.
template <class Tin, int KD, bool kKDA>
__device__ void form_vnew(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int buf, int mw,
                          const StateSmem<Tin, KD, kKDA>& s, const float (&av)[kBV / 8][4]) {
  const ChunkParams& p = sp.c;
  const int L = ck.len;
  const float* gb = s.gb(buf);
  const float b_end = kKDA ? 0.0f : gb[L - 1];
#pragma unroll
  for (int nt = 0; nt < kBV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(mw, e), j = acc_col(8 * nt, e);
      float vn = 0.0f, ve = 0.0f;
      if (r < L) {
        vn = (sp.u ? s.Us[r * kLdV + j] : 0.0f) - av[nt][e];
        if constexpr (!kKDA) ve = vn * exp2f(b_end - gb[r]) * (p.l2norm ? s.rk(buf)[r] : 1.0f);
        if (sp.vnew) sp.vnew[(int64_t(ck.t0 + r) * p.HV + hv) * sp.Vw + v0 + j] = vn;
      }
      s.VN[r * kLdV + j] = vn;
      if constexpr (!kKDA) s.VE[r * kLdV + j] = ve;
    }
}

// S = Gamma_end ⊙ S + kt^T @ vt over the chunk's valid rows.
template <bool kSplit, class Tin, int KD, bool kKDA>
__device__ void update_state(const ChunkInfo& ck, int buf, const StateSmem<Tin, KD, kKDA>& s, StateRegs<Tin, KD, kKDA>& S) {
  using Sm = StateSmem<Tin, KD, kKDA>;
  using Tl = StateTiling<KD>;
  constexpr bool SP = kSplit;
  const int L = ck.len;
  const float gdn_decay = kKDA ? 1.0f : exp2f(s.gb(buf)[L - 1]);
  for_state_elems<KD>([&](int i, int j, int e, int row, int) {
    S[i][j][e] *= kKDA ? exp2f(s.bend(buf)[row]) : gdn_decay;
  });
  const float* vt = kKDA ? s.VN : s.VE;
  for (int k0 = 0; k0 < L; k0 += 8) {
    FragA<SP> fa[Tl::MTW];
#pragma unroll
    for (int i = 0; i < Tl::MTW; ++i) fa[i] = load_a_col<SP>(s.Kt, Sm::ldk, Tl::m0(i), k0);
#pragma unroll
    for (int j = 0; j < Tl::NTW; ++j) {
      const FragB<SP> fb = load_b_kn<SP>(vt, kLdV, k0, Tl::n0(j));
#pragma unroll
      for (int i = 0; i < Tl::MTW; ++i) mma(S[i][j], fa[i], fb);
    }
  }
}

// o = rowscale ⊙ ao + Aqk @ vnew, stored in the dtype of the o view (rows < L).
template <bool kSplit, class Tin, int KD, bool kKDA>
__device__ void finish_output(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int buf, int mw,
                              const StateSmem<Tin, KD, kKDA>& s, float (&ao)[kBV / 8][4]) {
  constexpr bool S = kSplit;
  const ChunkParams& p = sp.c;
  const int L = ck.len;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(mw, e);
    float f = p.scale;
    if constexpr (!kKDA)
      if (r < L) f *= exp2f(s.gb(buf)[r]) * (p.l2norm ? s.rq(buf)[r] : 1.0f);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) ao[nt][e] *= f;
  }
  for (int k0 = 0; k0 < L; k0 += 8) {
    const FragA<S> fa = load_a_row<S>(s.As, kLdA, mw, k0);
#pragma unroll
    for (int nt = 0; nt < kBV / 8; ++nt) mma(ao[nt], fa, load_b_kn<S>(s.VN, kLdV, k0, 8 * nt));
  }
#pragma unroll
  for (int nt = 0; nt < kBV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(mw, e), j = acc_col(8 * nt, e);
      if (r < L) store_any(sp.o.p, sp.o.dt, int64_t(ck.t0 + r) * sp.o.st + int64_t(hv) * sp.o.sx + v0 + j, ao[nt][e]);
    }
}

template <class Tin, int KD, bool kKDA, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) chunk_state_kernel(const StateParams sp) {
  extern __shared__ float4 smem_f4[];
  const StateSmem<Tin, KD, kKDA> s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const int v0 = blockIdx.x * kBV, n = blockIdx.y / p.HV, hv = blockIdx.y % p.HV, mw = 16 * (threadIdx.x >> 5);
  const bool out = sp.o.p != nullptr;
  const int c_begin = p.seq_chunk0[n], c_end = p.seq_chunk0[n + 1];
  const StateView& h0 = sp.h0;
  StateRegs<Tin, KD, kKDA> S;
  for_state_elems<KD>([&](int i, int j, int e, int row, int col) {
    float x = 0.0f;
    if (sp.init == kInitGiven)
      x = load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + row * h0.si + (v0 + col) * h0.sj);
    else if (sp.init == kInitIdentity)
      x = row == v0 + col ? 1.0f : 0.0f;
    S[i][j][e] = x;
  });
  if (c_begin < c_end) {
    issue_group_a(sp, p.chunks[c_begin], hv, v0, 0, s);
    cp_async_commit();
    issue_group_b(sp, p.chunks[c_begin], c_begin, hv, s);
    cp_async_commit();
  }
  for (int c = c_begin; c < c_end; ++c) {
    const ChunkInfo ck = p.chunks[c];
    const int buf = (c - c_begin) & 1;
    for_state_elems<KD>([&](int i, int j, int e, int row, int col) {
      s.Ss[row * kLdV + col] = S[i][j][e];
      if (sp.h) sp.h[((int64_t(c) * p.HV + hv) * KD + row) * sp.Vw + v0 + col] = S[i][j][e];
    });
    cp_async_wait<1>();  // group A of chunk c
    __syncthreads();
    float av[kBV / 8][4] = {}, ao[kBV / 8][4] = {};
    products_w_q<kSplit>(s, mw, out, av, ao);
    form_vnew(sp, ck, hv, v0, buf, mw, s, av);
    __syncthreads();  // w, u, q consumed; VN, VE complete
    if (c + 1 < c_end) issue_group_a(sp, p.chunks[c + 1], hv, v0, buf ^ 1, s);
    cp_async_commit();
    cp_async_wait<1>();  // group B of chunk c
    __syncthreads();
    update_state<kSplit>(ck, buf, s, S);
    if (out) finish_output<kSplit>(sp, ck, hv, v0, buf, mw, s, ao);
    __syncthreads();  // k, Aqk, S tile, VN, VE consumed
    if (c + 1 < c_end) issue_group_b(sp, p.chunks[c + 1], c + 1, hv, s);
    cp_async_commit();
  }
  const StateView& f = sp.final_state;
  if (f.p)
    for_state_elems<KD>([&](int i, int j, int e, int row, int col) {
      store_any(f.p, f.dt, n * f.sn + hv * f.shv + row * f.si + (v0 + col) * f.sj, S[i][j][e]);
    });
}

}  // namespace

void launch_chunk_state(const StateParams& sp, int input_dtype, cudaStream_t stream, bool split) {
  const ChunkParams& p = sp.c;
  if (p.N * p.HV == 0) return;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      auto run = [&](auto kda, auto spl) {
        constexpr bool kKDA = decltype(kda)::value, kSplit = decltype(spl)::value;
        const size_t smem = StateSmem<Tin, KD, kKDA>::bytes;
        auto kernel = chunk_state_kernel<Tin, KD, kKDA, kSplit>;
        KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        kernel<<<dim3(sp.Vw / kBV, p.N * p.HV), kThreads, smem, stream>>>(sp);
        KCP_CUDA_LAUNCH_CHECK();
      };
      auto run_split = [&](auto kda) {
        if constexpr (kSplitProducts<Tin>) run(kda, std::true_type{});
        else if (split) run(kda, std::true_type{});
        else run(kda, std::false_type{});
      };
      if (p.kda) run_split(std::true_type{});
      else run_split(std::false_type{});
    });
  });
}

}  // namespace kcp::cuda
