// Backward stage "dhu", part 1 of 2: the chunk-local terms of the state-gradient recurrence, in
// parallel over the chunks (CPU twins chunk_bwd_dAv's dv_loc and chunk_state_backward's qg^T do).
// Grid (chunks, HV), 256 threads; per chunk, b the gate cumsum (log2 units), L rows:
//   kg  = kn Diag-per-row 2^(b_end - b_r)        [L,K]  -> bp.dkv  (free until the chunk stage; kda
//                                                          and gla: there already, the forward's; gdn
//                                                          with bf16 k: not formed, dhu_reads_raw_k)
//         (kn = k rstd_k, qn = q rstd_q: the fused L2 norm applied on load, load_qk_slabs)
//   A_c = Aqk^T do                               [L,V]  -> bp.dvnew (dhu adds kg dh: dvnew; not for gla,
//                                                          whose dv pass forms A_c itself: chunk_bwd_dh_gla.cu)
//   B_c = scale qg^T do,  qg_r = qn_r 2^(b_r)    [K,V]  -> bp.dh[c] (dhu reads it, then stores dh[c])
// Not run where dhu forms A_c and B_c itself (BwdParams::dhu_forms_local).
// gla's local backward with its dh chain (BwdParams::gla_dh_chain) runs none of it: the chain forms
// qg^T do itself from the forward's qg, kg is the forward's (dkv lives in its buffer) and the dv pass
// forms A_c (chunk_bwd_dh_gla.cu).
// A_c and B_c only with do (not for the transition's M^T), over 64-column slabs of V, on tensor cores
// (mma.sync; split operands, 3xTF32, where bwd_split_products says so, else one TF32 product).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {
namespace {

constexpr int kLdT = 72;  // [64][64] Aqk and do tiles, read as transposed A / k-major B fragments (8 mod 32)

template <int KD>
struct LocalSmem {
  static constexpr int ldq = KD + 8, kV = 64;  // qg [64][K], read as transposed A fragments (8 mod 32)
  static constexpr int floats = kChunk * ldq + 2 * kChunk * kLdT + 64;
  float *qg, *A, *dO, *gsc;
  __device__ explicit LocalSmem(float* s) : qg(s), A(s + kChunk * ldq), dO(A + kChunk * kLdT), gsc(dO + kChunk * kLdT) {}
};

// kg to the workspace and scale qg into shared memory (rows >= L zero), 32 keys at a time: q, k
// (with the fused norm applied; QkSlab, the next slab's loads in flight during this slab's work) and
// kda's gates (cp.async) staged in the A / dO tiles (free until the products). Four keys per thread
// and step: float4 reads of the staged rows, one 16-byte kg store. kda and gla: where dkv lives in
// the forward's kg buffer (backward_alias), the forward's kkt / WY stage left kg there already (the
// same rows, TF32-rounded with 16-bit inputs, which dhu's conversion on load leaves unchanged): no store.
template <int KD, bool kKDA, bool kSplit>
__device__ void local_gated_rows(const BwdParams& bp, const LocalSmem<KD>& s, const ChunkInfo& ck, int hv) {
  const ChunkParams& p = bp.c;
  const int L = ck.len, h = hv / p.G;
  float *qs = s.A, *ks = qs + kChunk * kLdS, *gs = kKDA ? ks + kChunk * kLdS : s.gsc;
  float* kg = bp.dkv + (int64_t(ck.t0) * p.HV + hv) * KD;  // row r at kg + r * HV * KD
  const int64_t ldg = int64_t(p.HV) * KD;
  // gdn with bfloat16 k: dhu reads k itself (dhu_reads_raw_k), no kg is formed
  const bool vec = qk_rows_vec16(p), store_kg = bp.dkv != p.kg && !dhu_reads_raw_k(p);
  QkSlab next;
  next.load(p, ck.t0, h, L, 0, true, vec, store_kg);
  for (int d0 = 0; d0 < KD; d0 += kSlab) {
    __syncthreads();  // the previous slab is consumed
    if constexpr (kKDA) copy_gates_async<true>(gs, kLdS, p, ck, hv, d0, kSlab);  // in flight during the q, k stores
    next.store(qs, store_kg ? ks : nullptr, kLdS, p, ck.t0, h, L, d0);
    if (d0 + kSlab < KD) next.load(p, ck.t0, h, L, d0 + kSlab, true, vec, store_kg);
    cp_async_wait_all();
    __syncthreads();
    for (int idx = threadIdx.x; idx < kChunk * kSlab / 4; idx += kBwdThreads) {
      const int r = idx / (kSlab / 4), c = 4 * (idx % (kSlab / 4));
      const float4 q4 = lds4(qs + r * kLdS + c);
      float g[4], ge[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = gate_of<kKDA>(gs, kLdS, r, c + e), ge[e] = gate_of<kKDA>(gs, kLdS, L - 1, c + e);
      if (r < L && store_kg) {
        const float4 k4 = lds4(ks + r * kLdS + c);
        *reinterpret_cast<float4*>(kg + r * ldg + d0 + c) = make_float4(k4.x * exp2f(ge[0] - g[0]), k4.y * exp2f(ge[1] - g[1]),
                                                                         k4.z * exp2f(ge[2] - g[2]), k4.w * exp2f(ge[3] - g[3]));
      }
      auto qg = [&](float q, int e) { return operand_store<kSplit>(p.scale * q * exp2f(g[e])); };  // only a product operand
      *reinterpret_cast<float4*>(s.qg + r * LocalSmem<KD>::ldq + d0 + c) = make_float4(qg(q4.x, 0), qg(q4.y, 1), qg(q4.z, 2), qg(q4.w, 3));  // rows >= L: q = 0
    }
  }
}

// Warp tiling of an [MT x 16 rows] x [8 x 8 columns] product over the 8 warps: warp w owns the
// m-tiles w % WM + WM i and the n-tiles (w / WM) NW + j.
template <int MT>
struct LocalTiling {
  static constexpr int WM = MT < 8 ? MT : 8, WN = 8 / WM, MW = MT / WM, NW = 8 / WN;
  __device__ static int m0(int i) { return 16 * (int(threadIdx.x >> 5) % WM + WM * i); }
  __device__ static int n0(int j) { return 8 * ((int(threadIdx.x >> 5) / WM) * NW + j); }
};

// acc (+)= X^T dO over the rows t in [t_lo(m0), L) of this warp's tiles, X = s.A (Aqk, masked to its
// lower triangle t >= r) or s.qg; tensor cores, split operands (3xTF32) when S. Unsplit, X is TF32
// already (Aqk as kkt stores it, qg as local_gated_rows stores it), so its fragments load without a
// conversion; dO's are converted: unsplit products admit a float64 do (bwd_split_products splits for
// float32 do only), whose float32 copy is not TF32.
template <int MT, bool kTri, int ldx, bool S>
__device__ void local_product(const float* X, const float* dO, int L, float (&acc)[LocalTiling<MT>::MW][LocalTiling<MT>::NW][4]) {
  using Tl = LocalTiling<MT>;
#pragma unroll
  for (int i = 0; i < Tl::MW; ++i) transposed_product<kTri, S>(X, ldx, dO, kLdT, L, Tl::m0(i), Tl::n0(0), acc[i]);
}

// Accumulator tiles to a row-major float array (row r at g + r * ld), rows < rows, columns < nc.
template <int MT>
__device__ void store_local(float* g, int64_t ld, int rows, int nc, const float (&acc)[LocalTiling<MT>::MW][LocalTiling<MT>::NW][4]) {
  using Tl = LocalTiling<MT>;
#pragma unroll
  for (int i = 0; i < Tl::MW; ++i)
#pragma unroll
    for (int j = 0; j < Tl::NW; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = acc_row(Tl::m0(i), 2 * h), c = acc_col(Tl::n0(j), 0);  // c even: (c, c + 1) both < nc or both not
        if (r < rows && c < nc) *reinterpret_cast<float2*>(g + r * ld + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
}

// A_c = Aqk^T do [L, 64] (kAc) and B_c = scale qg^T do [K, 64] for the value columns [j0, j0 + 64) (do
// of those columns in s.dO, zero past V and past row L).
template <int KD, bool kSplit, bool kAc>
__device__ void local_products(const BwdParams& bp, const LocalSmem<KD>& s, const ChunkInfo& ck, int hv, int j0) {
  using S = LocalSmem<KD>;
  const ChunkParams& p = bp.c;
  const int L = ck.len, nc = min(S::kV, p.V - j0);
  if constexpr (kAc) {
    float acc[LocalTiling<4>::MW][LocalTiling<4>::NW][4] = {};
    local_product<4, true, kLdT, kSplit>(s.A, s.dO, L, acc);
    store_local<4>(bp.dvnew + (int64_t(ck.t0) * p.HV + hv) * p.V + j0, int64_t(p.HV) * p.V, L, nc, acc);
  }
  constexpr int MT = KD / 16;
  float acc[LocalTiling<MT>::MW][LocalTiling<MT>::NW][4] = {};
  local_product<MT, false, S::ldq, kSplit>(s.qg, s.dO, L, acc);
  store_local<MT>(bp.dh + (int64_t(blockIdx.x) * p.HV + hv) * KD * p.V + j0, p.V, KD, nc, acc);
}

// Three blocks per multiprocessor (<= 80 registers; shared memory allows three): a thread keeps its
// 16 do loads in flight at once (load_rows_any: two 16-byte groups where the view allows) and the
// next q/k slab's (QkSlab) without spills on the 16-bit path (the float32-input one spills 12 bytes).
// kAc: A_c too (gdn, kda; gla's dv pass forms it, chunk_bwd_dh_gla.cu).
template <int KD, bool kKDA, bool kSplit, bool kAc>
__global__ void __launch_bounds__(kBwdThreads, 3) bwd_dhu_local_kernel(const __grid_constant__ BwdParams bp) {
  using S = LocalSmem<KD>;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = chunk_at(p, blockIdx.x);
  const int hv = blockIdx.y, L = ck.len;
  extern __shared__ __align__(16) float smem[];
  const S s(smem);
  if constexpr (!kKDA) copy_gates_async<false>(s.gsc, 0, p, ck, hv, 0, 1);  // waited for with the first slab
  local_gated_rows<KD, kKDA, kSplit>(bp, s, ck, hv);
  if (!bp.d_o.p) return;
  __syncthreads();  // the staged slabs are consumed
  if constexpr (kAc) copy_rows_async(s.A, kLdT, p.Aqk + (int64_t(blockIdx.x) * p.HV + hv) * kChunk * kChunk, kChunk, kChunk, 0, kChunk);
  for (int j0 = 0; j0 < p.V; j0 += S::kV) {
    __syncthreads();
    const int nc = min(S::kV, p.V - j0);
    load_rows_any<S::kV>(s.dO, kLdT, bp.d_o, ck.t0, hv, L, j0, nc);
    cp_async_wait_all();
    if (nc < S::kV)
      for (int idx = threadIdx.x; idx < kChunk * S::kV; idx += kBwdThreads)  // columns past V
        if (idx % S::kV >= nc) s.dO[(idx / S::kV) * kLdT + idx % S::kV] = 0.0f;
    __syncthreads();
    local_products<KD, kSplit, kAc>(bp, s, ck, hv, j0);
  }
}

}  // namespace

void launch_bwd_dhu_local(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.NT == 0 || bp.gla_dh_chain || bp.dhu_forms_local) return;  // those chains form their chunk-local terms
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    constexpr bool kS = decltype(split)::value;
    const size_t smem = sizeof(float) * LocalSmem<KD>::floats;
    if (p.gla) launch_kernel(bwd_dhu_local_kernel<KD, true, kS, false>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
    else if (p.kda) launch_kernel(bwd_dhu_local_kernel<KD, true, kS, true>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_dhu_local_kernel<KD, false, kS, true>, dim3(p.NT, p.HV), dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
