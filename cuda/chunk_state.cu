// Stage "state recurrence" (+ fused output): one block of 8 warps per (sequence n, value head hv,
// BV state columns [v0, v0+BV)), BV = 16 or 32, walking the chunks of n in order with the state
// S [K,BV] in registers (float32, tensor-core accumulator layout). Per chunk c with L valid rows:
//   h[c] = S                                         (stage tests only)
//   vnew = u_c - w_c @ S                    [L,BV]   (rows >= L are 0)
//   o_c  = scale * Gamma ⊙ (q_c @ S) + Aqk_c @ vnew  (gdn: Gamma_r = 2^b_r * rstd_q; kda: q_c = qg_c)
//   S    = Gamma_end ⊙ S + kt_c^T @ vt_c             gdn: kt = k, vt_r = vnew_r * 2^(b_end - b_r) * rstd_k
//                                                    kda: kt = kg (pre-gated), vt = vnew, Gamma_end per row
// Tiles arrive by cp.async in two groups so the next chunk's loads overlap this chunk's products:
//   group A = {w, u, q, gates} is refilled as soon as vnew is formed, group B = {k, Aqk} at the end.
// Fragments: w, qg, Aqk come by ldmatrix (row-major float tiles); S and vnew are written to shared
// memory transposed ([BV][K], [BV][64]) so their B fragments come by ldmatrix too; k and 16-bit q by
// scalar loads. Operands are stored TF32-rounded when products are not split (no conversions).
// The same kernel gives the CP transition: S_ext with init 0, and M with u = 0, init = I, Vw = K.
// Covered by tests/cuda/test_cuda_stages.cpp ("state"), test_cuda_forward.cpp (fused path) and
// test_cuda_transition.cpp.
#include "cuda/chunk_state.cuh"

#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"
#include "cuda/chunk_state_tiles.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

using namespace state;

// av = w @ S and ao = q @ S for this warp's 16 rows (both share the B fragments of S^T).
// acc = X @ S for this warp's 16 rows, X = w (w-warps) or q (q-warps).
template <bool S, bool kQ, class Tin, int KD, int BV, bool kKDA>
__device__ void product_with_state(const StateSmem<Tin, KD, BV, kKDA>& s, int mw, float (&acc)[BV / 8][4]) {
  using Sm = StateSmem<Tin, KD, BV, kKDA>;
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    FragA<S> fa;
    if constexpr (!kQ) fa = ldm_a_row<S>(s.Ws, Sm::ldw, mw, k0, true);
    else if constexpr (kKDA) fa = ldm_a_row<S>(s.Qs, Sm::ldq, mw, k0, true);
    else fa = load_a_row<S, true>(s.Qs, Sm::ldq, mw, k0);
#pragma unroll
    for (int n2 = 0; n2 < BV / 16; ++n2) {
      FragB<S> b0, b1;
      ldm_b_nk2<S>(b0, b1, s.St, Sm::lds, k0, 16 * n2, true);
      mma(acc[2 * n2], fa, b0), mma(acc[2 * n2 + 1], fa, b1);
    }
  }
}

// With 16-bit k and unsplit products the gdn update reads k^T by ldmatrix.trans (permuted k order).
template <bool S, class Tin, bool kKDA>
constexpr bool kPermutedK = !kKDA && !S && sizeof(Tin) == 2;

// vnew = u - w S into VNt (and, gdn, vnew * 2^(b_end - b_r) * rstd_k into VEt); rows >= L are zero.
template <bool S, class Tin, int KD, int BV, bool kKDA>
__device__ void form_vnew(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int buf, int mw,
                          const StateSmem<Tin, KD, BV, kKDA>& s, const float (&av)[BV / 8][4]) {
  using Sm = StateSmem<Tin, KD, BV, kKDA>;
  const ChunkParams& p = sp.c;
  const int L = ck.len, r0 = mw + lane_g();
  float fe[2] = {0.0f, 0.0f};  // gdn: per-row factor of the gated copy
  if constexpr (!kKDA) {
    const float* gb = s.gb(buf);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = r0 + 8 * hr;
      if (r < L) fe[hr] = exp2f(gb[L - 1] - gb[r]) * (p.l2norm ? s.rk(buf)[r] : 1.0f);
    }
  }
  float* vnew = sp.vnew ? sp.vnew + (int64_t(ck.t0) * p.HV + hv) * sp.Vw + v0 : nullptr;
#pragma unroll
  for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + 8 * (e >> 1), j = acc_col(8 * nt, e);
      float vn = 0.0f;
      if (r < L) {
        vn = (sp.u ? s.Us[r * Sm::ldu + j] : 0.0f) - av[nt][e];
        if (vnew) vnew[int64_t(r) * p.HV * sp.Vw + j] = vn;
      }
      s.VNt[j * kLdV + r] = operand_store<S>(vn);
      if constexpr (!kKDA) s.VEt[j * kLdV + (kPermutedK<S, Tin, kKDA> ? perm_pos(r) : r)] = operand_store<S>(vn * fe[e >> 1]);
    }
}

// S = Gamma_end ⊙ S + kt^T @ vt over the chunk's valid rows.
template <bool S, class Tin, int KD, int BV, bool kKDA>
__device__ void update_state(const ChunkInfo& ck, int buf, const StateSmem<Tin, KD, BV, kKDA>& s, StateRegs<KD, BV>& St) {
  using Sm = StateSmem<Tin, KD, BV, kKDA>;
  using Tl = StateTiling<KD, BV>;
  const int L = ck.len;
  const float gdn_decay = kKDA ? 1.0f : exp2f(s.gb(buf)[L - 1]);
  for_state_elems<KD, BV>([&](int i, int j, int e, int row, int) {
    St[i][j][e] *= kKDA ? exp2f(s.bend(buf)[row]) : gdn_decay;
  });
  const float* vt = kKDA ? s.VNt : s.VEt;
  for (int k0 = 0; k0 < L; k0 += 8) {
    FragA<S> fa[Tl::MTW];
#pragma unroll
    for (int i = 0; i < Tl::MTW; ++i) {
      if constexpr (kPermutedK<S, Tin, kKDA>) fa[i] = ldm_a_col16_perm(s.Kt, Sm::ldk, Tl::m0(i), k0);
      else fa[i] = load_a_col<S, true>(s.Kt, Sm::ldk, Tl::m0(i), k0);
    }
#pragma unroll
    for (int j = 0; j < Tl::NTW; ++j) {
      const FragB<S> fb = ldm_b_nk<S>(vt, kLdV, k0, Tl::n0(j), true);
#pragma unroll
      for (int i = 0; i < Tl::MTW; ++i) mma(St[i][j], fa[i], fb);
    }
  }
}

// o = rowscale ⊙ ao + Aqk @ vnew, stored in the dtype of the o view (rows < L).
template <bool S, class Tin, int KD, int BV, bool kKDA>
__device__ void finish_output(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int buf, int mw,
                              const StateSmem<Tin, KD, BV, kKDA>& s, float (&ao)[BV / 8][4]) {
  const ChunkParams& p = sp.c;
  const int L = ck.len;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(mw, e);
    float f = p.scale;
    if constexpr (!kKDA)
      if (r < L) f *= exp2f(s.gb(buf)[r]) * (p.l2norm ? s.rq(buf)[r] : 1.0f);
#pragma unroll
    for (int nt = 0; nt < BV / 8; ++nt) ao[nt][e] *= f;
  }
  for (int k0 = 0; k0 < L; k0 += 8) {
    const FragA<S> fa = ldm_a_row<S>(s.As, kLdA, mw, k0, true);
#pragma unroll
    for (int n2 = 0; n2 < BV / 16; ++n2) {
      FragB<S> b0, b1;
      ldm_b_nk2<S>(b0, b1, s.VNt, kLdV, k0, 16 * n2, true);
      mma(ao[2 * n2], fa, b0), mma(ao[2 * n2 + 1], fa, b1);
    }
  }
#pragma unroll
  for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(mw, e), j = acc_col(8 * nt, e);
      if (r < L) store_any(sp.o.p, sp.o.dt, int64_t(ck.t0 + r) * sp.o.st + int64_t(hv) * sp.o.sx + v0 + j, ao[nt][e]);
    }
}

template <class Tin, int KD, int BV, bool kKDA, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) chunk_state_kernel(const StateParams sp) {
  using Sm = StateSmem<Tin, KD, BV, kKDA>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const int v0 = blockIdx.x * BV, n = blockIdx.y / p.HV, hv = blockIdx.y % p.HV;
  const bool q_warp = threadIdx.x >= kThreads / 2;         // warps 4-7: q S and the output
  const int mw = 16 * (int(threadIdx.x >> 5) % (kWarps / 2));  // this warp's 16 rows of the chunk
  const bool out = sp.o.p != nullptr;
  const int c_begin = p.seq_chunk0[n], c_end = p.seq_chunk0[n + 1];
  const StateView& h0 = sp.h0;
  StateRegs<KD, BV> S;
  for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
    float x = 0.0f;
    if (sp.init == kInitGiven) x = load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + row * h0.si + (v0 + col) * h0.sj);
    else if (sp.init == kInitIdentity) x = row == v0 + col ? 1.0f : 0.0f;
    S[i][j][e] = x;
  });
  if (c_begin < c_end) {
    issue_group_a(sp, p.chunks[c_begin], hv, v0, 0, s);
    cp_async_commit();
    issue_group_b(sp, p.chunks[c_begin], c_begin, hv, s);
    cp_async_commit();
  }
  ChunkInfo ck = c_begin < c_end ? p.chunks[c_begin] : ChunkInfo{};
  for (int c = c_begin; c < c_end; ++c) {
    const ChunkInfo next = c + 1 < c_end ? p.chunks[c + 1] : ck;  // loaded early, used mid-chunk
    const int buf = (c - c_begin) & 1;
    for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
      s.St[col * Sm::lds + row] = operand_store<kSplit>(S[i][j][e]);
      if (sp.h) sp.h[((int64_t(c) * p.HV + hv) * KD + row) * sp.Vw + v0 + col] = S[i][j][e];
    });
    cp_async_wait<1>();  // group A of chunk c
    __syncthreads();
    float ao[BV / 8][4] = {};  // q-warps: q S, then the output
    if (!q_warp) {
      float av[BV / 8][4] = {};
      product_with_state<kSplit, false>(s, mw, av);
      form_vnew<kSplit>(sp, ck, hv, v0, buf, mw, s, av);
    } else if (out) {
      product_with_state<kSplit, true>(s, mw, ao);
    }
    __syncthreads();  // w, u, q consumed; vnew tiles complete
    if (c + 1 < c_end) issue_group_a(sp, next, hv, v0, buf ^ 1, s);
    cp_async_commit();
    cp_async_wait<1>();  // group B of chunk c
    __syncthreads();
    update_state<kSplit>(ck, buf, s, S);
    if (out && q_warp) finish_output<kSplit>(sp, ck, hv, v0, buf, mw, s, ao);
    __syncthreads();  // k, Aqk, S^T, vnew tiles consumed
    if (c + 1 < c_end) issue_group_b(sp, next, c + 1, hv, s);
    cp_async_commit();
    ck = next;
  }
  const StateView& f = sp.final_state;
  if (f.p)
    for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
      store_any(f.p, f.dt, n * f.sn + hv * f.shv + row * f.si + (v0 + col) * f.sj, S[i][j][e]);
    });
}

}  // namespace

void launch_chunk_state(const StateParams& sp, int input_dtype, cudaStream_t stream, bool split) {
  const ChunkParams& p = sp.c;
  if (p.N * p.HV == 0) return;
  static int sms = 0;
  if (!sms) KCP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // 16 columns per block when 32 would leave more than half of the multiprocessors idle (K >= 64:
  // with K = 32 a 16-column state tile does not split over 8 warps).
  const bool narrow = p.K >= 64 && int64_t(sp.Vw / 32) * p.N * p.HV <= sms / 2;
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      auto run = [&](auto kda, auto spl, auto bv) {
        constexpr bool kKDA = decltype(kda)::value, kSplit = decltype(spl)::value;
        constexpr int BV = decltype(bv)::value;
        const size_t smem = StateSmem<Tin, KD, BV, kKDA>::bytes;
        auto kernel = chunk_state_kernel<Tin, KD, BV, kKDA, kSplit>;
        KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        kernel<<<dim3(sp.Vw / BV, p.N * p.HV), kThreads, smem, stream>>>(sp);
        KCP_CUDA_LAUNCH_CHECK();
      };
      auto run_bv = [&](auto kda, auto spl) {
        if constexpr (KD >= 64)
          if (narrow) return run(kda, spl, std::integral_constant<int, 16>{});
        run(kda, spl, std::integral_constant<int, 32>{});
      };
      auto run_split = [&](auto kda) {
        if constexpr (kSplitProducts<Tin>) run_bv(kda, std::true_type{});
        else if (split) run_bv(kda, std::true_type{});
        else run_bv(kda, std::false_type{});
      };
      if (p.kda) run_split(std::true_type{});
      else run_split(std::false_type{});
    });
  });
}

}  // namespace kcp::cuda
