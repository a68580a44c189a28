// Backward stage "dhu", part 2, for gla (chunk_bwd_dhu.cu serves the delta variants). With w = 0 the
// state-gradient recurrence (CPU twin chunk_state_backward)
//   dh[c] = dh;   dvnew = A_c + kg dh;   dh <- Diag(2^b_end) dh + B_c
// has no product inside the chain: every element of dh evolves on its own (B_c = scale qg^T do and kg
// come from chunk_bwd_dhu_local.cu, in the dh[c] slots and dkv; A_c = Aqk^T do is formed by the dv
// pass below, its only reader). So:
//   scan:  one thread per 4 consecutive state columns of one key row of one (sequence, value head),
//          chunks last to first: B_c read from the dh[c] slot, dh[c] = dh stored there, dh = gamma dh
//          + B_c; the B_c and gates of the next kAhead chunks are loaded ahead of use (none depends on
//          the chain). dh0 after the first chunk. The CP transition: dS_ext from 0 with B_c (columns
//          < V), M^T from I without (decay only: M^T stays diagonal).
//   dv:    dv = dvnew = Aqk^T do + kg dh[c] in parallel over the chunks, one block of 8 warps per
//          (chunk, value head, 64 or 32 columns): the transposed lower-triangular Aqk tile times the
//          do tile, then the product of gla's output kernel (rows_times_tile), written in dv's dtype
//          (gla's dvnew has no other reader: kernel hv skips it, and dhu_local writes no A_c for gla:
//          its float32 round trip, 2 TT HV V floats, replaced by reading Aqk and do here).
//   chain: Pipeline::backward's local pass (BwdParams::gla_dh_chain, where gla_dh_chain_applies)
//          instead of the scan: the forward's chain walked backwards (chunk_state_gla.cu), forming
//          scale qg^T do inside each step from the forward's qg and do, so dhu_local does not run
//          (no B_c: 0.54 GB written and read back at T = 32768, H = 16; kg is the forward's). The
//          scan stays for the CP transition (dS_ext, M^T), mixed dtypes and shapes the chain does not take.
// Measured (H200, bf16, H = 16, K = V = 128; docs/BENCHMARKS.md, twelfth session): dhu 1.21-1.24 ->
// 0.73 ms at T = 32768 and 0.29 -> 0.19 ms at T = 8192 against the chain it replaces (ncu at T = 8192:
// scan 101 us, dvnew 111 us).
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, end to end, the
// transitions).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/chunk_state_gla.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/gla_halves.cuh"
#include "cuda/tile_mma.cuh"
#include "cuda/tile_store.cuh"

namespace kcp::cuda {
namespace {

constexpr int kScanThreads = 128;
constexpr int kAhead = 4;  // chunks of B_c and gates loaded ahead of the chain (8 measured no faster)

struct ScanTerm {
  float4 b;  // B_c (zero where there is none)
  float g;   // b_end of the key row (log2 units)
};

__global__ void __launch_bounds__(kScanThreads) gla_dh_scan_kernel(const BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV;
  const int q = blockIdx.y * kScanThreads + int(threadIdx.x);  // 4 columns: (key i, columns j..j+3)
  if (4 * q >= p.K * bp.Vw) return;
  const int i = 4 * q / bp.Vw, j = 4 * q % bp.Vw;
  const bool local = bp.d_o.p != nullptr && j < p.V;  // B_c exists (the M^T columns have none)
  float d[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) d[e] = dhu_init(bp, n, hv, i, j + e);
  const int c_lo = p.seq_chunk0[n], c_hi = p.seq_chunk0[n + 1] - 1;
  const SeqTokens tok = seq_tokens(p, c_lo, c_hi - c_lo + 1);
  const float* gate = p.gcum + int64_t(hv) * p.K + i;  // row tt at gate + tt * HV * K
  auto slot = [&](int c) { return bp.dh + ((int64_t(c) * p.HV + hv) * p.K + i) * p.V + j; };
  auto fetch = [&](int c) {
    ScanTerm x{make_float4(0.0f, 0.0f, 0.0f, 0.0f), 0.0f};
    if (c < c_lo) return x;
    x.g = gate[int64_t(tok.last(c - c_lo)) * p.HV * p.K];
    if (local) x.b = *reinterpret_cast<const float4*>(slot(c));
    return x;
  };
  ScanTerm ring[kAhead];
#pragma unroll
  for (int r = 0; r < kAhead; ++r) ring[r] = fetch(c_hi - r);
  const bool keep = bp.keep && local;  // dh[c] is kept for the V columns only
  for (int c0 = c_hi; c0 >= c_lo; c0 -= kAhead) {
#pragma unroll
    for (int r = 0; r < kAhead; ++r) {  // constant ring indices: the ring stays in registers
      const int c = c0 - r;
      if (c < c_lo) break;
      const ScanTerm x = ring[r];
      ring[r] = fetch(c - kAhead);
      if (keep) *reinterpret_cast<float4*>(slot(c)) = make_float4(d[0], d[1], d[2], d[3]);  // B_c was read kAhead steps ago
      const float f = exp2f(x.g);
      d[0] = fmaf(f, d[0], x.b.x), d[1] = fmaf(f, d[1], x.b.y), d[2] = fmaf(f, d[2], x.b.z), d[3] = fmaf(f, d[3], x.b.w);
    }
  }
  const StateView& o = bp.dh0;
  if (o.p) {
#pragma unroll
    for (int e = 0; e < 4; ++e) store_any(o.p, o.dt, n * o.sn + hv * o.shv + i * o.si + (j + e) * o.sj, d[e]);
  }
}

// ---- dv = Aqk^T do + kg dh[c] -----------------------------------------------------------------

constexpr int kDvThreads = 256;

// KH: keys per stage. KH = KD (K <= 64): one stage, every tile loaded at once. K = 128 runs KH = 64:
// kg and dh[c] in key halves through the same tiles (71 KB: 3 blocks per multiprocessor, where one
// stage of 128 keys took 107.5 KB and 2), the second half's copies in flight during A_c = Aqk^T do;
// the sum's order: kg dh of keys 0..63, then A_c, then the rest. H200, T = 32768: the dhu stage
// 1.05 -> 0.99 ms (docs/BENCHMARKS.md, twenty-ninth session).
template <int KD, int BV, int KH = KD>
struct DvSmem {
  // kg: row-major A by ldmatrix (4 mod 32); dh[c]: k-major B (8 mod 32); Aqk [t][r], read as the
  // transposed A (element (r, t) at t * lda + r: 8 mod 32, as dhu_local reads it); do: k-major B (8 mod 32)
  static constexpr int ldk = KH + 4, ldh = BV + 8, lda = kChunk + 8, ldd = BV + 8;
  static constexpr size_t bytes = 4 * (size_t(kChunk) * ldk + size_t(KH) * ldh + size_t(kChunk) * (lda + ldd));
};

// Warp w: rows 16 (w % 4), columns [c0, c0 + BV/2) with c0 = (w / 4) BV/2. dvnew is gla's dv (P = I,
// u = v, no beta), its only use: written in dv's dtype here (kernel hv neither reads dvnew nor
// copies it out; the dvnew buffer is not used for gla).
template <int KD, int BV, bool kSplit, int KH = KD>
__global__ void __launch_bounds__(kDvThreads, KH < KD ? 3 : 1) gla_dvnew_kernel(const BwdParams bp) {
  using Sm = DvSmem<KD, BV, KH>;
  constexpr int NTW = BV / 16;
  extern __shared__ float4 smem_f4[];
  float* Ks = reinterpret_cast<float*>(smem_f4);
  float* Hs = Ks + kChunk * Sm::ldk;
  float* As = Hs + KH * Sm::ldh;
  float* Ds = As + kChunk * Sm::lda;
  const ChunkParams& p = bp.c;
  const int nvt = p.V / BV, ci = blockIdx.x / nvt, j0 = (blockIdx.x % nvt) * BV, hv = blockIdx.y;
  const ChunkInfo ck = chunk_at(p, ci);
  const int64_t t = (int64_t(ci) * p.HV + hv) * KD;  // dh[c]'s first key row
  // keys [key0, key0 + KH) of kg and dh[c]: dh[c] first, its address does not wait for the chunk's
  // table entry (ck), which kg's does. (dh[c] stays float32 in memory: kernel hv's gate term 2^b_end
  // rowsum(h dh) reads it unrounded, and with dh stored TF32-rounded dg's error against the oracle grew
  // 2-4x: docs/BENCHMARKS.md, 24th session.)
  auto issue_keys = [&](int key0) {
    copy_rows_async<KH, 4 * BV, kDvThreads>(Hs, Sm::ldh, KH, bp.dh + (t + key0) * p.V + j0, p.V);
    copy_rows_async<kChunk, 4 * KH, kDvThreads>(Ks, Sm::ldk, ck.len, bp.dkv + (int64_t(ck.t0) * p.HV + hv) * KD + key0,
                                                p.HV * KD);
  };
  // after this thread's wait, before the barrier: its own dh rows corrected (the dh chain in halves:
  // dh_local + D_c dh_mid, kept for hv) and TF32-rounded
  auto ready_keys = [&](int key0) {
    if (bp.dh_mid > 0 && ci < bp.dh_mid)
      correct_own_rows<KH, BV, kDvThreads>(bp.dh_decay + t + key0, bp.dh_smid + (int64_t(hv) * KD + key0) * p.V + j0,
                                           bp.dh + (t + key0) * p.V + j0, p.V, Hs, Sm::ldh);
    if constexpr (!kSplit) round_own_rows_tf32<KH, 4 * BV, kDvThreads>(Hs, Sm::ldh);
  };
  issue_keys(0);
  copy_rows_async<kDvThreads>(As, Sm::lda, p.Aqk + (int64_t(ci) * p.HV + hv) * kChunk * kChunk, kChunk, ck.len, 0, kChunk);
  cp_async_commit();
  load_rows_any<BV>(Ds, Sm::ldd, bp.d_o, ck.t0, hv, ck.len, j0, BV);  // do [L, BV], zero past L, while the tiles arrive
  const int w = int(threadIdx.x >> 5), mw = 16 * (w % 4), c0 = (w / 4) * (BV / 2);
  cp_async_wait<0>();
  ready_keys(0);
  __syncthreads();
  float acc[NTW][4] = {};
  if constexpr (KH == KD) {
    transposed_product<true, kSplit>(As, Sm::lda, Ds, Sm::ldd, ck.len, mw, c0, acc);  // A_c = Aqk^T do
    rows_times_tile<kSplit, false, KD>(Ks, Sm::ldk, Hs, Sm::ldh, mw, c0, acc);  // + kg dh[c] (kg is not stored rounded)
  } else {
    rows_times_tile<kSplit, false, KH>(Ks, Sm::ldk, Hs, Sm::ldh, mw, c0, acc);  // kg dh[c], keys [0, KH)
#pragma unroll 1
    for (int key0 = KH; key0 < KD; key0 += KH) {
      __syncthreads();  // Ks, Hs consumed
      issue_keys(key0);
      cp_async_commit();
      if (key0 == KH) transposed_product<true, kSplit>(As, Sm::lda, Ds, Sm::ldd, ck.len, mw, c0, acc);  // + A_c meanwhile
      cp_async_wait<0>();
      ready_keys(key0);
      __syncthreads();
      rows_times_tile<kSplit, false, KH>(Ks, Sm::ldk, Hs, Sm::ldh, mw, c0, acc);
    }
  }
  store_acc_rows(bp.dv.p, bp.dv.dt, row_off(bp.dv, ck.t0, hv) + j0 + c0, bp.dv.st, ck.len, mw, acc);
}

// dh by the forward's chain walked backwards (chunk_state_gla.cu): qg for kg, do for v, dht for h0,
// dh0 for the final state.
void launch_dh_chain(const BwdParams& bp, cudaStream_t stream) {
  StateParams sp;
  sp.c = bp.c;
  sp.c.kg = bp.c.qg;
  sp.c.v = bp.d_o;
  sp.Vw = bp.c.V;
  sp.init = bp.dht.p ? kInitGiven : kInitZero;
  sp.h0 = bp.dht;
  sp.final_state = bp.dh0;
  sp.h = bp.dh;
  sp.mid = bp.dh_mid, sp.s_mid = bp.dh_smid, sp.f_local = bp.dh_flocal, sp.decay = bp.dh_decay;
  launch_gla_dh_chain(sp, bp.d_o.dt, stream);
  // halves: dh0 = f_local + D_end s_mid (the earlier half's end decays the later half's last state)
  if (bp.dh_mid > 0 && bp.dh0.p) launch_gla_halves_final(sp, stream);
}

}  // namespace

void launch_bwd_dhu_gla(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  KCP_CHECK(p.gla && bp.Vw % 4 == 0, "gla dhu: expected gla and state columns a multiple of 4");
  KCP_CHECK(!bp.gla_dh_chain || gla_dh_chain_applies(bp), "gla dhu: the dh chain does not apply to this call");
  if (bp.gla_dh_chain) {
    launch_dh_chain(bp, stream);
  } else if (p.N * p.HV > 0) {
    const dim3 grid(p.N * p.HV, (p.K * bp.Vw / 4 + kScanThreads - 1) / kScanThreads);
    launch_kernel(gla_dh_scan_kernel, grid, dim3(kScanThreads), 0, stream, bp);
  }
  KCP_CHECK(bp.dh_mid == 0 || (bp.gla_dh_chain && bp.keep && bp.d_o.p && bp.dh && bp.dv.p),
            "gla dhu in halves: expected the dh chain and the dv pass (which corrects dh)");
  if (!(bp.keep && bp.d_o.p && bp.dh && bp.dv.p) || p.NT == 0 || p.HV == 0) return;  // dv: dvnew's only reader
  dispatch_bwd(bp, [&](auto kd, auto split) {
    constexpr int KD = decltype(kd)::value;
    constexpr bool kS = decltype(split)::value;
    auto run = [&](auto bv) {
      constexpr int BV = decltype(bv)::value;
      const dim3 grid(p.NT * (p.V / BV), p.HV);
      constexpr int KH = KD > 64 ? 64 : KD;
      launch_kernel(gla_dvnew_kernel<KD, BV, kS, KH>, grid, dim3(kDvThreads), DvSmem<KD, BV, KH>::bytes, stream, bp);
    };
    if (p.V % 64 == 0) run(std::integral_constant<int, 64>{});
    else run(std::integral_constant<int, 32>{});
  });
}

}  // namespace kcp::cuda
