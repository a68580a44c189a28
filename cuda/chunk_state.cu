// Stage "state recurrence" (+ fused output): one block of 8 warps per (sequence n, value head hv,
// BV state columns [v0, v0+BV)), BV = 16 or 32, walking the chunks of n in order with the state
// S [K,BV] in registers (float32, tensor-core accumulator layout). Per chunk c with L valid rows:
//   h[c] = S                                         (stage tests and the kept forward)
//   vnew = u_c - w_c @ S                    [L,BV]   (rows >= L are 0)
//   o_c  = scale * Gamma ⊙ (q_c @ S) + Aqk_c @ vnew  (gdn: Gamma_r = 2^b_r * rstd_q; kda: q_c = qg_c)
//   S    = Gamma_end ⊙ S + kt_c^T @ vt_c             gdn: kt = k, vt_r = vnew_r * 2^(b_end - b_r) * rstd_k
//                                                    kda: kt = kg (pre-gated), vt = vnew, Gamma_end per row
// gla runs chunk_state_gla.cu instead (its recurrence splits over key rows as well).
// Tiles arrive by cp.async in two groups so the next chunk's loads overlap this chunk's products:
//   group A = {w, u, q, gates} is refilled as soon as vnew is formed, group B = {k, Aqk} at the end.
// Fragments: w, qg, Aqk come by ldmatrix (row-major float tiles); S and vnew are written to shared
// memory transposed ([BV][K], [BV][64]) so their B fragments come by ldmatrix too; k and 16-bit q by
// scalar loads. Operands are stored TF32-rounded when products are not split (no conversions).
// The same kernel gives the CP transition (but gdn's with 16-bit inputs, which the folded kernel
// runs): S_ext with init 0, and M with u = 0, init = I, Vw = K; both in one launch where that fits in
// one wave (kInitTransition: Vw = V + K columns, u for the first V).
// It serves kda, float32 inputs and the transition; the gdn forward with 16-bit inputs runs the
// folded kernel (chunk_state_fold.cu) instead.
// Covered by tests/cuda/test_cuda_stages.cpp ("state"), test_cuda_forward.cpp (fused path) and
// test_cuda_transition.cpp.
#include "cuda/chunk_state.cuh"

#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/key_dims.h"
#include "cuda/chunk_state_tiles.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {

using namespace state;

constexpr size_t kMaxSmem = 227 * 1024;  // dynamic shared memory of one Hopper block

// acc = X @ S for this warp's 16 rows and the BV state columns, X = w (w-warps) or q (q-warps).
template <bool S, bool kQ, class Sm>
__device__ void product_with_state(const Sm& s, int st, int mw, float (&acc)[Sm::kBVw / 8][4]) {
  constexpr int NC = Sm::kBVw;
  constexpr int KD = Sm::kKD;
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    FragA<S> fa;
    constexpr bool kPerm = kQ && Sm::kPermutedQ;  // q fragments and S^T rows in the permuted k order
    if constexpr (!kQ) fa = ldm_a_row<S>(s.Ws(st), Sm::ldw, mw, k0, true);
    else if constexpr (Sm::kIsKDA) fa = ldm_a_row<S>(s.Qs(st), Sm::ldq, mw, k0, true);
    else if constexpr (kPerm) fa = ldm_a_row16_perm(s.Qs(st), Sm::ldq, mw, k0);
    else fa = load_a_row<S, true>(s.Qs(st), Sm::ldq, mw, k0);
#pragma unroll
    for (int n2 = 0; n2 < NC / 16; ++n2) {
      FragB<S> b0, b1;
      ldm_b_nk2<S>(b0, b1, kPerm ? s.Stp : s.St, Sm::lds, k0, 16 * n2, true);
      mma(acc[2 * n2], fa, b0), mma(acc[2 * n2 + 1], fa, b1);
    }
  }
}

// With 16-bit k and unsplit products the gdn update reads k^T by ldmatrix.trans (permuted k order).
template <bool S, class Sm>
constexpr bool kPermutedK = !Sm::kIsKDA && !S && sizeof(typename Sm::In) == 2;

// vnew = u - w S into VNt (and, gdn, vnew * 2^(b_end - b_r) * rstd_k into VEt); rows >= L are zero.
template <bool S, class Sm>
__device__ void form_vnew(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int st, int buf, int mw,
                          const Sm& s, const float (&av)[Sm::kBVw / 8][4]) {
  constexpr int BV = Sm::kBVw;
  const ChunkParams& p = sp.c;
  const int L = ck.len, r0 = mw + lane_g();
  float fe[2] = {0.0f, 0.0f};  // gdn: per-row factor of the gated copy
  if constexpr (!Sm::kIsKDA) {
    const float* gb = s.gb(buf);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = r0 + 8 * hr;
      if (r < L) fe[hr] = exp2f(gb[L - 1] - gb[r]) * (p.l2norm ? s.rk(buf)[r] : 1.0f);
    }
  }
  float* vnew = sp.vnew ? sp.vnew + (int64_t(ck.t0) * p.HV + hv) * sp.Vw + v0 : nullptr;
  const auto* us = s.Us(st);
  const bool has_u = takes_u(sp, v0);
#pragma unroll
  for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
    for (int e0 = 0; e0 < 4; e0 += 2) {  // elements e0, e0 + 1: columns j, j + 1 of row r
      const int r = r0 + 4 * e0, j = acc_col(8 * nt, e0);
      float vn[2] = {0.0f, 0.0f};
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        if (r < L) vn[d] = (has_u ? to_float(us[r * Sm::ldu + j + d]) : 0.0f) - av[nt][e0 + d];
        s.VNt[(j + d) * kLdV + r] = operand_store<S>(vn[d]);
        if constexpr (!Sm::kIsKDA)
          s.VEt[(j + d) * kLdV + (kPermutedK<S, Sm> ? perm_pos(r) : r)] = operand_store<S>(vn[d] * fe[e0 >> 1]);
      }
      // together: whole 32-byte sectors and half the store instructions of one element each
      if (vnew && r < L) *reinterpret_cast<float2*>(vnew + int64_t(r) * p.HV * sp.Vw + j) = make_float2(vn[0], vn[1]);
    }
}

// S = Gamma_end ⊙ S + kt^T @ vt over the chunk's valid rows.
template <bool S, class Sm>
__device__ void update_state(const ChunkInfo& ck, int st, int buf, const Sm& s, StateRegs<Sm::kKD, Sm::kBVw>& Sr) {
  using Tl = StateTiling<Sm::kKD, Sm::kBVw>;
  constexpr bool kKDA = Sm::kIsKDA;
  const int L = ck.len;
  const float gdn_decay = kKDA ? 1.0f : exp2f(s.gb(buf)[L - 1]);
  for_state_elems<Sm::kKD, Sm::kBVw>([&](int i, int j, int e, int row, int) {
    Sr[i][j][e] *= kKDA ? exp2f(s.bend(buf)[row]) : gdn_decay;
  });
  const float* vt = kKDA ? s.VNt : s.VEt;
  const auto* kt = s.Kt(st);
  for (int k0 = 0; k0 < L; k0 += 8) {
    FragA<S> fa[Tl::MTW];
#pragma unroll
    for (int i = 0; i < Tl::MTW; ++i) {
      if constexpr (kPermutedK<S, Sm>) fa[i] = ldm_a_col16_perm(kt, Sm::ldk, Tl::m0(i), k0);
      else fa[i] = load_a_col<S, true>(kt, Sm::ldk, Tl::m0(i), k0);
    }
#pragma unroll
    for (int j = 0; j < Tl::NTW; ++j) {
      const FragB<S> fb = ldm_b_nk<S>(vt, kLdV, k0, Tl::n0(j), true);
#pragma unroll
      for (int i = 0; i < Tl::MTW; ++i) mma(Sr[i][j], fa[i], fb);
    }
  }
}

// o = rowscale ⊙ ao + Aqk @ vnew, stored in the dtype of the o view (rows < L).
template <bool S, class Sm>
__device__ void finish_output(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int st, int buf, int mw,
                              const Sm& s, float (&ao)[Sm::kBVw / 8][4]) {
  constexpr int NC = Sm::kBVw;
  const ChunkParams& p = sp.c;
  const int L = ck.len;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(mw, e);
    float f = p.scale;
    if constexpr (!Sm::kIsKDA)
      if (r < L) f *= exp2f(s.gb(buf)[r]) * (p.l2norm ? s.rq(buf)[r] : 1.0f);
#pragma unroll
    for (int nt = 0; nt < NC / 8; ++nt) ao[nt][e] *= f;
  }
  for (int k0 = 0; k0 < L; k0 += 8) {
    const FragA<S> fa = ldm_a_row<S>(s.As(st), kLdA, mw, k0, true);
#pragma unroll
    for (int n2 = 0; n2 < NC / 16; ++n2) {
      FragB<S> b0, b1;
      ldm_b_nk2<S>(b0, b1, s.VNt, kLdV, k0, 16 * n2, true);
      mma(ao[2 * n2], fa, b0), mma(ao[2 * n2 + 1], fa, b1);
    }
  }
  store_acc_rows(sp.o.p, sp.o.dt, int64_t(ck.t0) * sp.o.st + int64_t(hv) * sp.o.sx + v0, sp.o.st, L, mw, ao);
}

// One chunk's products: phase 1 (w-warps: vnew; q-warps: q S), then phase 2 (all: the state update;
// q-warps: the output). `between` runs after phase 1, at a barrier (the 1-stage load refill).
template <bool S, class Sm, class F>
__device__ void chunk_products(const StateParams& sp, const ChunkInfo& ck, int hv, int v0, int st, int buf, const Sm& s,
                               StateRegs<Sm::kKD, Sm::kBVw>& Sr, F&& between) {
  const bool q_warp = threadIdx.x >= kThreads / 2, out = sp.o.p != nullptr;  // warps 4-7: q S and the output
  const int mw = 16 * (int(threadIdx.x >> 5) % (kWarps / 2));               // this warp's 16 rows
  float ao[Sm::kBVw / 8][4] = {};
  if (!q_warp) {
    float av[Sm::kBVw / 8][4] = {};
    product_with_state<S, false>(s, st, mw, av);
    form_vnew<S>(sp, ck, hv, v0, st, buf, mw, s, av);
  } else if (out) {
    product_with_state<S, true>(s, st, mw, ao);
  }
  __syncthreads();  // vnew tiles complete; w, u, q consumed
  between();
  update_state<S>(ck, st, buf, s, Sr);
  if (out && q_warp) finish_output<S>(sp, ck, hv, v0, st, buf, mw, s, ao);
  __syncthreads();  // k, Aqk, S^T, vnew tiles consumed
}

template <class Tin, int KD, int BV, bool kKDA, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) chunk_state_kernel(const StateParams sp) {
  using Sm = StateSmem<Tin, KD, BV, kKDA, !kKDA && !kSplit && sizeof(Tin) == 2>;
  extern __shared__ float4 smem_f4[];
  const Sm s(reinterpret_cast<char*>(smem_f4));
  const ChunkParams& p = sp.c;
  const ChainBlock b = chain_block(p, BV);
  const int v0 = b.v0, n = b.n, hv = b.hv, c_begin = b.c_begin, c_end = b.c_end;
  const StateView& h0 = sp.h0;
  StateRegs<KD, BV> Sr;
  for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
    float x = 0.0f;
    if (sp.init == kInitGiven) x = load_any(h0.p, h0.dt, n * h0.sn + hv * h0.shv + row * h0.si + (v0 + col) * h0.sj);
    else if (sp.init == kInitIdentity) x = row == v0 + col ? 1.0f : 0.0f;
    else if (sp.init == kInitTransition) x = row == v0 + col - sp.Vu ? 1.0f : 0.0f;  // M's columns only (row >= 0)
    Sr[i][j][e] = x;
  });
  ChunkInfo ck = c_begin < c_end ? p.chunks[c_begin] : ChunkInfo{};
  if (c_begin < c_end) {
    issue_group_a(sp, ck, hv, v0, 0, 0, s);
    cp_async_commit();
    issue_group_b(sp, ck, c_begin, hv, 0, s);
    cp_async_commit();
  }
  for (int c = c_begin; c < c_end; ++c) {
    const ChunkInfo next = c + 1 < c_end ? p.chunks[c + 1] : ck;  // loaded early, used mid-chunk
    const int buf = (c - c_begin) & 1, st = 0;
    for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
      s.St[col * Sm::lds + row] = operand_store<kSplit>(Sr[i][j][e]);
      if constexpr (Sm::kPermutedQ) s.Stp[col * Sm::lds + perm_pos(row)] = operand_store<kSplit>(Sr[i][j][e]);
      if (sp.h && (e & 1) == 0)  // pairs of adjacent columns: whole sectors, half the store instructions
        *reinterpret_cast<float2*>(sp.h + ((int64_t(c) * p.HV + hv) * KD + row) * sp.Vw + v0 + col) =
            make_float2(Sr[i][j][e], Sr[i][j][e + 1]);
    });
    cp_async_wait<1>();  // group A of chunk c
    __syncthreads();
    chunk_products<kSplit>(sp, ck, hv, v0, st, buf, s, Sr, [&] {
      if (c + 1 < c_end) issue_group_a(sp, next, hv, v0, 0, buf ^ 1, s);
      cp_async_commit();
      cp_async_wait<1>();  // group B of chunk c
      __syncthreads();
    });
    if (c + 1 < c_end) issue_group_b(sp, next, c + 1, hv, 0, s);
    cp_async_commit();
    ck = next;
  }
  const StateView& f = sp.final_state;
  if (f.p)
    for_state_elems<KD, BV>([&](int i, int j, int e, int row, int col) {
      store_any(f.p, f.dt, n * f.sn + hv * f.shv + row * f.si + (v0 + col) * f.sj, Sr[i][j][e]);
    });
}

}  // namespace

// 16 columns per block when 32 would leave more than half of the multiprocessors idle (K >= 64:
// with K = 32 a 16-column state tile does not split over 8 warps).
bool chunk_state_narrow(const ChunkParams& p, int Vw) {
  return p.K >= 64 && int64_t(Vw / 32) * p.N * p.HV <= multiprocessors(p) / 2;
}

int64_t chunk_state_blocks(const ChunkParams& p, int Vw) { return int64_t(Vw / (chunk_state_narrow(p, Vw) ? 16 : 32)) * p.N * p.HV; }

void launch_chunk_state(const StateParams& sp, int input_dtype, cudaStream_t stream, bool split) {
  const ChunkParams& p = sp.c;
  if (p.N * p.HV == 0) return;
  KCP_CHECK(!p.gla, "chunk_state: gla runs chunk_state_gla.cu");
  KCP_CHECK(sp.init != kInitTransition || (sp.Vu % 32 == 0 && sp.Vu < sp.Vw),
            "chunk_state: the joint S_ext / M launch needs V a multiple of 32");
  const bool narrow = chunk_state_narrow(p, sp.Vw);
  dispatch_input_type(input_dtype, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    dispatch_key_dim(p.K, [&](auto kd) {
      constexpr int KD = decltype(kd)::value;
      // kda: per-channel gate
      auto run = [&](auto kda, auto spl, auto bv) {
        constexpr bool kKDA = decltype(kda)::value, kSplit = decltype(spl)::value;
        constexpr int BV = decltype(bv)::value;
        const size_t smem = StateSmem<Tin, KD, BV, kKDA, !kKDA && !kSplit && sizeof(Tin) == 2>::bytes;
        static_assert(StateSmem<Tin, KD, BV, kKDA, true>::bytes <= kMaxSmem, "state tiles exceed shared memory");
        launch_kernel(chunk_state_kernel<Tin, KD, BV, kKDA, kSplit>, dim3(sp.Vw / BV, p.N * p.HV), kThreads, smem,
                      stream, sp);
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
