// Backward stage "chunk", kernel 1 of 3: the products over the value dimension (CPU twins
// chunk_bwd_dAv's dAqk, chunk_bwd_ht_products, chunk_inter_backward, the dv / dbeta / dk parts of
// chunk_wy_backward and the inter part of chunk_gate_cumsum_backward). One block of two halves of 256
// threads per (chunk, value head) item: half z owns key rows [64 z, 64 z + KW) of h,
// dh (KW = min(K, 64); with K <= 64 half 1 owns none and only forms W1; gla with K <= 64 has no half 1).
// The halves share one copy of P, do, vnew, dvnew and dXu (two blocks used to load and form each
// twice). gla shares nothing costly between them: with K = 128 its halves are two blocks of 256,
// adjacent in the grid, two per multiprocessor (HvShape::kKeyBlocks). V streams in slabs of 32
// columns, double-buffered: slab j + 1 is copied (cp.async; do, and gla's v, into registers) while
// slab j is computed. Per chunk:
//   dXu = P^T dvnew                               [L,V]   (P unit lower triangular)
//   dv  = beta dXu,  dbeta += v . dXu             (gla: dv = dXu = dvnew, P = I, u = v)
//   doh = do h^T,  xw = -dXu h^T,  vdh = vnew dh^T   [L,KW]   (per half)
//   dA  = lower_incl(scale do vnew^T) (half 0),  W1 = dvnew vnew^T (half 1)   [64,64] -> workspace
// gla (kDelta = false): vnew = v is read from v; P = I and beta_e = 0, so dXu = dvnew = dv (written by dhu, chunk_bwd_dh_gla.cu: no dvnew slab here), and the xw and
// dbeta terms vanish (beta factors): no P, no P^T dvnew, no dXu h^T, no W1 (kernel wy does not run,
// kernel intra takes dL = 0), no dbeta partials.
// Every product on tensor cores: split operands (3xTF32, tile_mma.cuh) on mma.sync m16n8k8 where
// bwd_split_products says so (float32 inputs), else one TF32 product (chunk_bwd.cuh): dXu on
// mma.sync, the h and X products of the delta rule on wgmma m64nNk8 (slab_products_wg; A from
// registers, B from the slabs in the 128-byte swizzle), gla's on mma.sync. Warp w of a half owns rows
// 16 (w % 4) and half of the columns (wgmma: warp group w / 4 of the half, the same accumulators).
// Epilogue (dq, dk inter parts, gate and dbeta partials): chunk_bwd_hv_epilogue.cuh.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "chunk" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_hv_epilogue.cuh"
#include "cuda/chunk_bwd_hv_stage.cuh"
#include "cuda/chunk_bwd_hv_tiles.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"
#include "cuda/wgmma.cuh"

namespace kcp::cuda {
namespace {

using namespace hv;

// dXu = P^T dvnew for one slab (tensor cores; P stored transposed, s.P[r][s] = P'_sr), all 16 warps
// of the block: warp W owns rows 16 (W % 4), columns 8 (W / 4) .. + 7. Each stores dv = beta dXu and
// adds v . dXu to vp (rows g and g + 8 of its tile). v comes from the slab's staged rows where kStaged
// (copied a slab ahead); loading it here, as the other form does, leaves a round trip to wait for at
// the end of the product (0.14 ms of gdn's hv at T = 32768).
template <bool S, bool kStaged>
__device__ void slab_dxu(const BwdParams& bp, const HvSmem& s, const ChunkInfo& ck, int hv, int j0, float (&vp)[2]) {
  const int W = threadIdx.x >> 5, m0 = 16 * (W & 3), n0 = 8 * (W >> 2), L = ck.len;
  SlabV sv;  // v for v . dXu: staged a slab ahead (kStaged: 16-bit pairs), else in flight during the product
  if constexpr (kStaged) {  // braces: see slab_products on "if constexpr" before a #pragma
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint16_t*>(s.vst) + acc_row(m0, e) * kLdVs + acc_col(n0, e));
      sv.bits[e] = w & 0xffffu, sv.bits[e + 1] = w >> 16;
    }
  } else {
    sv.load(bp.c.v, ck.t0, hv, L, j0);
  }
  float c[4] = {};
  for (int k0 = m0; k0 < L; k0 += 8) {  // P'_sr = 0 for s < r
    FragA<S> a;  // ldmatrix (kLdC = 4 mod 32: conflict-free); element loads for split fragments (fewer registers)
    if constexpr (S) a = load_a<S, true>([&](int m, int k) { return s.P[m * kLdC + k]; }, m0, k0);
    else a = ldm_a_row<S>(s.P, kLdC, m0, k0, true);
    mma<S>(c, a, load_b<S, true>([&](int k, int n) { return s.dvn[k * kLdV + n]; }, k0, n0));
  }
  const RowsView& v = bp.c.v;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(m0, e), j = acc_col(n0, e);
    s.dxu[r * kLdV + j] = operand_store<S>(c[e]);  // only ever a product operand: rounded once here
    if (r < L) vp[e >> 1] = fmaf(bits_to_float(sv.bits[e], v.dt), c[e], vp[e >> 1]);
  }
  if (bp.dv.p) {  // four columns of a row per store where the view allows (tile_store.cuh store_acc_rows)
    float d[1][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) d[0][e] = s.bet[acc_row(m0, e)] * c[e];  // rows >= L are not stored
    store_acc_rows(bp.dv.p, bp.dv.dt, row_off(bp.dv, ck.t0, hv) + j0 + n0, bp.dv.st, L, m0, d);
  }
}


// The unsplit products of one slab (16-bit inputs: every operand is stored TF32) on wgmma, by warp
// group w / 4 of a half: m64 over the chunk's rows, N = KW / 2 h columns from (w / 4) KW / 2 and 32 X
// columns from 32 (w / 4). wgmma m64nN's accumulators are mma.sync's m16n8 tiles side by side
// (wgmma.cuh), so HvAcc and the epilogue are those of the mma.sync form below. A (do, dXu, vnew,
// dvnew) from registers by ldmatrix; B (h, dh, vnew rows: K-major) from the swizzled slabs. A commit
// group per k step, the A fragments double-buffered: a group's registers are loaded again only after
// wait<1> has retired it (wgmma reads register operands asynchronously). Measured against A read
// from the slabs by descriptor (do, dXu, dvnew swizzled too; the front products issued before
// slab_dxu so that they run during it): slower, gdn hv 1.72 -> 1.79 ms at T = 32768 (docs/CUDA.md).
template <int KW, bool kH, int kX>
__device__ void slab_products_wg(const HvSmem& s, HvAcc<KW / 16>& a, int w) {
  constexpr int NH = KW / 2;
  const int m0 = 16 * (w & 3), hb = (w >> 2) * NH, xb = 32 * (w >> 2);
  auto& doh = reinterpret_cast<float(&)[NH / 2]>(a.doh);
  auto& xw = reinterpret_cast<float(&)[NH / 2]>(a.xw);
  auto& vdh = reinterpret_cast<float(&)[NH / 2]>(a.vdh);
  auto& X = reinterpret_cast<float(&)[16]>(a.X);
  // B descriptors (K-major, swizzled): h and dh rows of the group's h columns, vnew rows of its X columns
  // (by desc_warp: in uniform registers)
  const uint64_t b_h = wg::desc_warp(s.h + hb * kSlab, 16, 1024, true);
  const uint64_t b_dh = wg::desc_warp(s.dh + hb * kSlab, 16, 1024, true);
  const uint64_t b_vn = wg::desc_warp(s.vn + xb * kSlab, 16, 1024, true);
  struct Frags {
    FragA<false> x, o, xu, vn;  // X's A (do or dvnew), do (kX = 1), dXu, vnew
  };
  auto load = [&](Frags& f, int k0) {
    f.x = ldm_a_row<false>(kX == 0 ? s.dO : s.dvn, kLdV, m0, k0, true);
    if constexpr (kH) {
      if constexpr (kX == 1) f.o = ldm_a_row<false>(s.dO, kLdV, m0, k0, true);
      f.xu = ldm_a_row<false>(s.dxu, kLdV, m0, k0, true);
      f.vn = ldm_a_slab<true, false>(s.vn, m0, k0);
    }
  };
  auto issue = [&](const Frags& f, int k0) {
    const uint32_t kb = 4 * k0;  // bytes along the swizzled rows
    wg::fence();
    if constexpr (kH) {
      wg::mma_tf32_ra<NH>(doh, kX == 0 ? f.x.hi : f.o.hi, wg::adv(b_h, kb), true);
      wg::mma_tf32_ra<NH>(xw, f.xu.hi, wg::adv(b_h, kb), true);
      wg::mma_tf32_ra<NH>(vdh, f.vn.hi, wg::adv(b_dh, kb), true);
    }
    wg::mma_tf32_ra<32>(X, f.x.hi, wg::adv(b_vn, kb), true);
    wg::commit();
  };
  auto pin = [](Frags& f) {  // the registers a retired group read (none unloaded: no undefined values kept)
    wg::pin(f.x.hi);
    if constexpr (kH && kX == 1) wg::pin(f.o.hi);
    if constexpr (kH) wg::pin(f.xu.hi), wg::pin(f.vn.hi);
  };
  static_assert(kSlab == 32, "four k steps a slab");
  Frags f0, f1;
  load(f0, 0), issue(f0, 0);
  load(f1, 8), issue(f1, 8);
  wg::wait<1>(), pin(f0);
  load(f0, 16), issue(f0, 16);
  wg::wait<1>(), pin(f1);
  load(f1, 24), issue(f1, 24);
  wg::wait<0>(), pin(f0), pin(f1);
  wg::pin(doh), wg::pin(xw), wg::pin(vdh), wg::pin(X);
}

// One slab of the products of warp w of a half (tensor cores, TF32 or 3xTF32 by S): the three h
// products (kH) and dA (kX = 0, a = do) or W1 (kX = 1, a = dvnew). Warp w: rows 16 (w % 4); h columns
// (w / 4) KW/2 + 8 nt, X columns 32 (w / 4) + 8 nt. gla (kDelta = false): no xw = dXu h^T, no W1.
// Every operand is stored TF32-rounded unless S, so no fragment is converted on load (exact = true;
// split products split every fragment anyway): do and gla's v by SlabPrefetch::store, dXu by
// slab_dxu, vnew, dvnew, h, dh by round_own_copies. The delta rule's unsplit products run on wgmma
// (slab_products_wg); its vnew, h, dh slabs are swizzled (kSw, chunk_bwd_hv_tiles.cuh).
template <int KW, bool kH, int kX, bool kDelta, bool S>
__device__ void slab_products(const HvSmem& s, HvAcc<KW / 16>& a, int w) {
  if constexpr (kHvWgmma<kDelta, S>) {
    slab_products_wg<KW, kH, kX>(s, a, w);
    return;
  }
  constexpr int NTW = KW / 16;
  constexpr bool kSw = HvShape<kChunk, kDelta>::kSw;  // the layout depends on kDelta only
  static_assert(NTW % 2 == 0, "B fragments come in pairs of 8-column tiles");
  constexpr bool kXp = kDelta || kX == 0;  // the X product is needed
  const int m0 = 16 * (w & 3), hb = (w >> 2) * (KW / 2), xb = 32 * (w >> 2);
  // Fragments by ldmatrix: the slabs are row-major (A: rows of do, dvnew, dXu, vnew) and h, dh, vnew
  // n-major for B (h^T, dh^T, vnew^T), padded (kLdV = 4 mod 32 words) or swizzled: conflict-free.
#pragma unroll 1
  for (int k0 = 0; k0 < kSlab; k0 += 8) {
    FragA<S> ax;
    if constexpr (kXp) ax = ldm_a_row<S>(kX == 0 ? s.dO : s.dvn, kLdV, m0, k0, true);
    if constexpr (kH) {
      FragA<S> ado, axu;
      if constexpr (kX == 0 && kXp) ado = ax;
      else ado = ldm_a_row<S>(s.dO, kLdV, m0, k0, true);
      if constexpr (kDelta) axu = ldm_a_row<S>(s.dxu, kLdV, m0, k0, true);
      const FragA<S> avn = ldm_a_slab<kSw, S>(s.vn, m0, k0);
#pragma unroll
      for (int nt = 0; nt < NTW; nt += 2) {
        FragB<S> bh[2], bdh[2];
        ldm_b_slab2<kSw, S>(bh[0], bh[1], s.h, k0, hb + 8 * nt);
        ldm_b_slab2<kSw, S>(bdh[0], bdh[1], s.dh, k0, hb + 8 * nt);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          mma<S>(a.doh[nt + u], ado, bh[u]);
          if constexpr (kDelta) mma<S>(a.xw[nt + u], axu, bh[u]);
          mma<S>(a.vdh[nt + u], avn, bdh[u]);
        }
      }
    }
    if constexpr (kXp) {  // braces: nvcc 13 can take the statements after "if constexpr (c) #pragma unroll
                          // for (...)" into the if (seen this session: a whole epilogue left the PTX)
#pragma unroll
      for (int nt = 0; nt < 4; nt += 2) {
        FragB<S> b[2];
        ldm_b_slab2<kSw, S>(b[0], b[1], s.vn, k0, xb + 8 * nt);
        mma<S>(a.X[nt], ax, b[0]);
        mma<S>(a.X[nt + 1], ax, b[1]);
      }
    }
  }
}


// After the slab loop: dA (half 0, lower triangle with the diagonal, scaled) or W1 (half 1) to the
// workspace, then the epilogue and the gate / dbeta partials (every thread reaches every barrier).
template <int KD, bool kKDA, bool kDelta, bool kSplit>
__device__ __forceinline__ void hv_finish(const BwdParams& bp, float* smem, const HvAcc<HvShape<KD, kDelta>::NTW>& a,
                                          const float (&vp)[2], const HvItem& it, const HvThread& th) {
  using S = HvShape<KD, kDelta>;
  const ChunkParams& p = bp.c;
  const ChunkInfo& ck = it.ck;
  const int L = ck.len, hv = it.hv;
  const bool has_h = th.z < S::NH;
  const int d0 = has_h ? th.z * S::KW : 0;
  float* X = (th.z == 0 ? bp.dAc : bp.Wc) + it.blk * kChunk * kChunk;
  if (kDelta || th.z == 0) {  // gla: no W1
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {  // columns c, c + 1 (c even) of row r: one 8-byte store
        const int r = acc_row(16 * (th.w & 3), e), c = acc_col(32 * (th.w >> 2) + 8 * nt, e);
        const float x0 = a.X[nt][e], x1 = a.X[nt][e + 1];
        *reinterpret_cast<float2*>(X + r * kChunk + c) =
            th.z == 0 ? make_float2(c <= r ? p.scale * x0 : 0.0f, c + 1 <= r ? p.scale * x1 : 0.0f) : make_float2(x0, x1);
      }
  }
  if constexpr (kHvQkStaged<kDelta, kSplit>) cp_async_wait_all();  // the staged q, k rows (pending where V is one slab)
  __syncthreads();  // slabs consumed: the row blocks' key totals reuse them (kda, gla)
  const HvSmem s = carve_hv<KD, kDelta>(smem, 0, th.z);
  float vsum = 0.0f;  // row t = tid of half 0 (gla: no dbeta term from v)
  if constexpr (kDelta) vsum = reduce_vsum(s, vp);
  KeyScans<S::NTW> ks;  // kda, gla
  if (has_h) {
    hv_epilogue<KD, kKDA, kDelta, kSplit>(bp, s, a, ck, hv, d0, th, ks);
  } else if (kDelta && th.t < L) {  // no key rows (K <= 64, half 1): zero partials (gla has none: chunk_sum skips it)
    float* pt = bp.part + (int64_t(ck.t0 + th.t) * p.HV + hv) * kPartSlots;
    pt[kPartDbetaHv + th.z] = 0.0f;
    if constexpr (!kKDA) pt[kPartDaHv + th.z] = 0.0f;
  }
  __syncthreads();
  if constexpr (kKDA)
    if (has_h) hv_key_da<KD, S::NTW, S::KW>(bp, s, ks, ck, hv, d0, th);
  if constexpr (kDelta)  // gla: no dbeta partials (chunk_sum does not run for gla)
    if (has_h) hv_gate_partials<KD, kKDA, kDelta>(bp, s, ck, hv, th, vsum);
}

// The slab loop of one item (hv_start done): slab j + 1's copies issued while slab j is computed.
template <int KD, bool kDelta, bool kSplit, class Pre>
__device__ __forceinline__ void hv_slabs(const BwdParams& bp, float* smem, const HvItem& it, const HvThread& th,
                                         Pre& pdo, Pre& pv, HvAcc<HvShape<KD, kDelta>::NTW>& a, float (&vp)[2]) {
  using S = HvShape<KD, kDelta>;
  constexpr int NT = S::kThreads;
  const ChunkParams& p = bp.c;
  const ChunkInfo& ck = it.ck;
  const int ns = p.V / kSlab, L = ck.len;
  const bool has_h = th.z < S::NH;
  for (int j = 0; j < ns; ++j) {
    const HvSmem s = carve_hv<KD, kDelta>(smem, j & 1, th.z);
    if (j > 0) cp_async_wait_all();  // slab 0: waited by hv_start (which leaves the staged q, k rows in flight)
    round_own_copies<KD, kDelta, !kSplit, NT>(carve_hv<KD, kDelta>(smem, j & 1, 0));
    pdo.template store<!kSplit>(s.dO);  // only product operands: rounded once here unless split
    if constexpr (!kDelta) pv.template store<!kSplit>(s.vn);
    if constexpr (kHvWgmma<kDelta, kSplit>) wg::fence_proxy_async();  // this thread's slab writes, for wgmma
    __syncthreads();  // slab j complete; slab j - 1 consumed (its buffer takes slab j + 1)
    if (j + 1 < ns) {
      if constexpr (kHvQkStaged<kDelta, kSplit>) issue_slab_v<NT>(p, carve_hv<KD, kDelta>(smem, (j + 1) & 1, 0), it, kSlab * (j + 1));
      issue_slab<KD, kDelta, NT>(bp, carve_hv<KD, kDelta>(smem, (j + 1) & 1, 0), it, kSlab * (j + 1));
      pdo.load(bp.d_o, ck.t0, it.hv, L, kSlab * (j + 1));
      if constexpr (!kDelta) pv.load(p.v, ck.t0, it.hv, L, kSlab * (j + 1));
    }
    if constexpr (kDelta) slab_dxu<kSplit, kHvQkStaged<kDelta, kSplit>>(bp, s, ck, it.hv, kSlab * j, vp);  // gla: dv = dvnew was written by dhu
    if constexpr (kDelta) __syncthreads();  // dXu complete
    if (th.z == 0) slab_products<S::KW, true, 0, kDelta, kSplit>(s, a, th.w);
    else if (has_h) slab_products<S::KW, true, 1, kDelta, kSplit>(s, a, th.w);
    else if constexpr (kDelta) slab_products<S::KW, false, 1, kDelta, kSplit>(s, a, th.w);
  }
}

// One block per (chunk, value head) item. (A block per multiprocessor walking the items, with the next
// item's first loads issued during this item's gdn epilogue, measured slower: branch study/hv-overlap,
// docs/BENCHMARKS.md, eighteenth session.)
template <int KD, bool kKDA, bool kDelta, bool kSplit>
__global__ void __launch_bounds__(HvShape<KD, kDelta>::kThreads, HvShape<KD, kDelta>::kMinBlocks) bwd_hv_kernel(const __grid_constant__ BwdParams bp) {
  using S = HvShape<KD, kDelta>;
  constexpr int NT = S::kThreads;
  const ChunkParams& p = bp.c;
  extern __shared__ __align__(16) float smem[];
  if constexpr (S::kSw) expect_swizzle_aligned(smem);
  const HvItem it = hv_item<KD, kDelta>(p, blockIdx.x);
  const HvThread th = hv_thread<KD, kDelta>();
  SlabPrefetch<NT, !kSplit> pdo, pv;  // do (and gla's v) of the next slab
  pdo.load(bp.d_o, it.ck.t0, it.hv, it.ck.len, 0);
  if constexpr (!kDelta) pv.load(p.v, it.ck.t0, it.hv, it.ck.len, 0);
  if constexpr (kHvQkStaged<kDelta, kSplit>) issue_slab_v<NT>(p, carve_hv<KD, kDelta>(smem, 0, 0), it, 0);  // committed with hv_issue's copies
  hv_issue<KD, kKDA, kDelta>(bp, smem, it);
  // q's and k's rows (and kda's gates) in a group of their own after slab 0's: only the epilogue
  // reads them, so hv_start does not wait for them (they land during slab 0; the slab loop's next
  // wait, or hv_finish's, takes them)
  if constexpr (kHvQkStaged<kDelta, kSplit>) issue_qk_rows<KD, kKDA, NT>(p, smem + S::floats, it);
  hv_start<KD, kDelta, kSplit>(smem);
  HvAcc<S::NTW> a = {};
  float vp[2] = {};
  hv_slabs<KD, kDelta, kSplit>(bp, smem, it, th, pdo, pv, a, vp);
  hv_finish<KD, kKDA, kDelta, kSplit>(bp, smem, a, vp, it, th);
}

}  // namespace

void launch_bwd_hv(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    constexpr bool kS = decltype(split)::value;
    auto launch = [&](auto kernel, auto kda, auto delta) {  // S::kKeyBlocks blocks of S::kHalves halves per (chunk, value head)
      constexpr bool kD = decltype(delta)::value;
      using S = HvShape<KD, kD>;
      const size_t floats = S::floats + kHvStagedFloats<KD, decltype(kda)::value, kD, kS>;
      launch_kernel(kernel, dim3(p.NT * p.HV * S::kKeyBlocks), dim3(S::kThreads), sizeof(float) * floats, stream, bp);
    };
    if (p.gla) launch(bwd_hv_kernel<KD, true, false, kS>, std::true_type{}, std::false_type{});
    else if (p.kda) launch(bwd_hv_kernel<KD, true, true, kS>, std::true_type{}, std::true_type{});
    else launch(bwd_hv_kernel<KD, false, true, kS>, std::false_type{}, std::true_type{});
  });
}

}  // namespace kcp::cuda
