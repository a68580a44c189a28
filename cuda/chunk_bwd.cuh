// The chunkwise backward on the GPU (ALGORITHMS.md 4.9-4.13; CPU twin reference/chunkwise_backward.cpp),
// its parameter block and launchers. The forward intermediates come from the forward's stages run
// again (cumsum, kkt, WY, state with h and vnew kept); then, all float32:
//   (q and k are read with the fused L2 norm applied on load: qn = q rstd_q; chunk_bwd_tiles.cuh)
//   dhu    (chunk_bwd_dhu_local.cu, then chunk_bwd_dhu.cu): the chunk-local terms A_c = Aqk^T do,
//          B_c = scale qg^T do (gdn with bf16 q, k, do: formed in the chain instead, dhu_forms_local)
//          and kg in parallel over the chunks; then per (sequence, value head,
//          16 or 32 state columns), chunks last to first: dh[c] = gradient of the state leaving c;
//          dvnew = A_c + kg dh; dh_in = Diag(gamma_end) dh + B_c - w^T dvnew; dh0 after chunk 0
//   chunk  (chunk_bwd_chunk.cu: kernels hv, wy, intra and a sum): per (chunk, value head): dq, dk
//          (per value head), dv, dbeta_e, da (gradient w.r.t. the per-token log decay a) from h, dh,
//          vnew, dvnew, P
//   finish (chunk_bwd_finish.cu): dq, dk summed over the value heads of a q/k head and through the
//          L2 norm; dbeta through the sigmoid; dg, dA_log, ddt_bias through the gate formula. Where
//          that is a copy (direct_qk for every variant, direct_dg for kda / gla, below), kernel intra
//          writes them instead.
// gla (ChunkParams::gla) runs the same stages without the delta rule (beta_e = 0, P = I, w = 0,
// vnew = v): the recompute runs the forward's gla kernels (kkt: Aqk, kg, qg; no WY; the state from
// v: no P, w, u), dhu skips w, kernel hv writes dv = dvnew and skips P^T dvnew, dXu h^T and W1, kernels wy and
// sum do not run, intra takes dL = 0; dbeta_e is not written.
// The same dhu kernel gives the CP transition backward: dS_ext (init 0, with do) and M^T (init I,
// do = 0) as the V + K columns of one launch (init = kInitTransition).
// Covered by tests/cuda/test_cuda_backward.cpp.
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunk_params.cuh"
#include "cuda/dispatch.cuh"

namespace kcp::cuda {

struct OutScalarView {  // writable [X] (dA_log, ddt_bias)
  void* p = nullptr;
  int64_t s = 0;
  int dt = kF32;
};

__device__ __forceinline__ int64_t row_off(const OutRowsView& v, int64_t tt, int x) { return tt * v.st + int64_t(x) * v.sx; }

// Slots of BwdParams::part: the dbeta partials of the two blocks of kernel 1, the gdn da partials
// of kernel 1 (2) and of kernel 3 (gdn's: one; kda/gla's kernel writes da itself).
constexpr int kPartSlots = 8, kPartDbetaHv = 0, kPartDaHv = 2, kPartDaIntra = 4;

struct BwdParams {
  ChunkParams c;
  // forward intermediates (float32 workspace)
  const float* h = nullptr;     // [NT,HV,K,V] state entering each chunk
  const float* vnew = nullptr;  // [TT,HV,V] (gla: null, vnew = v)
  // cotangents
  RowsView d_o;                 // [B,T,HV,V]; p null: zero (transition backward)
  StateView dht;                // gradient of the final state; p null: zero
  int init = kInitZero;         // dhu start: kInitZero (dht or 0) or kInitTransition (dS_ext from 0 in
                                // columns [0, V), M^T from I in [V, V + K))
  int Vw = 0;                   // dhu state columns: V, or V + K for the transition
  bool keep = true;             // dhu stores dh[c] and dvnew (false: only the chain's end is needed)
  // gla's dh chain of one sequence walked as two halves at once (chunk_bwd_dh_gla.cu; StateParams::mid):
  // dh_mid > 0 the first chunk of the later half; [HV,K,V], [HV,K,V], [NT+1,HV,K] float32 buffers.
  int dh_mid = 0;
  float *dh_smid = nullptr, *dh_flocal = nullptr, *dh_decay = nullptr;
  // backward workspace (float32)
  float* dh = nullptr;          // [NT,HV,K,V] gradient of the state leaving each chunk (null: not kept)
  float* dvnew = nullptr;       // [TT,HV,V] (null: not kept)
  float* dqv = nullptr;         // [TT,HV,K] dq per value head (before the group sum and L2 norm)
  float* dkv = nullptr;         // [TT,HV,K]
  float* dbeta_e = nullptr;     // [TT,HV] gradient w.r.t. the effective beta
  float* da = nullptr;          // [TT,HV,Kg] gradient w.r.t. a (natural log decay)
  float* dx = nullptr;          // [TT,HV,Kg] gradient w.r.t. g + dt_bias (fused gate)
  float* dalog = nullptr;       // [TT,HV,Kg] per-element dA_log terms (fused gate)
  float* dAc = nullptr;         // [NT,HV,64,64] dAqk of each chunk (chunk stage, kernel 1 -> 3)
  float* Wc = nullptr;          // [NT,HV,64,64] dvnew vnew^T, then dL (kernel 1 -> 2 -> 3)
  float* part = nullptr;        // [TT,HV,kPartSlots] partial sums of dbeta_e and (gdn) da, summed in a fixed order
  // outputs (p null: not computed)
  StateView dh0;                // [N,HV,K,V] (or the transition's dS_ext / M^T)
  OutRowsView dq, dk, dv, dg, dbeta;
  OutScalarView dA_log, ddt_bias;
  // direct_qk_outputs, direct_dg_output below: kernel intra (every variant's), the last writer of dqv,
  // dkv and (kda / gla) da, writes dq and dk (one value head per q/k head; kda / gla without the L2
  // norm, gdn with it too: its blocks own whole rows) and dg (kda / gla, log-decay gate: dg = da) in
  // their dtypes instead, and finish skips them: no float32 round trip of three [TT,HV,K] tensors.
  bool direct_qk = false, direct_dg = false;
  // gla (gla_dh_chain_applies below): dh by the forward's chain reversed (qg^T do formed inside the
  // chain, chunk_state_gla.cu) instead of the scan over B_c; dhu_local then does not run (no B_c, kg
  // is the forward's, in dkv already, and the dv pass forms A_c).
  bool gla_dh_chain = false;
  // gdn's dhu forms its chunk-local terms itself (dhu_forms_local_applies below): A_c = Aqk^T do from
  // the forward's Aqk and do's bf16 rows, B_c = scale qn^T Diag(2^b) do from q's and do's; dhu_local
  // does not run.
  bool dhu_forms_local = false;
  // gla: [NT,HV,K/32] per (chunk, slab) 1 where chunk_bwd_intra_gla.cu's kernel (one anchor per chunk)
  // did kernel intra's work, 0 where it left it to chunk_bwd_intra.cu's (set there, in the otherwise
  // unused Wc; null for kda: every block runs the general kernel).
  int* gla_intra_anchored = nullptr;
};

// Pipeline::backward sets BwdParams::direct_qk / direct_dg from these, once the outputs are set: an
// output not asked for keeps its workspace path (the stage tests read dqv, dkv, da).
inline bool direct_qk_outputs(const BwdParams& bp) {
  return (!bp.c.l2norm || !(bp.c.kda || bp.c.gla)) && bp.c.G == 1 && bp.dq.p && bp.dk.p;
}
inline bool direct_dg_output(const BwdParams& bp) { return (bp.c.kda || bp.c.gla) && bp.c.gate == kGateLogDecay && bp.dg.p; }

// Pipeline::backward's local pass for gla: the chain needs K, V multiples of 32, the V columns kept
// from a zero or d_final_state start, the forward's kg in dkv (backward_alias) and its qg, which kkt
// stores TF32-rounded for 16-bit q, k, v and unrounded for float32 ones: do must be of the same kind
// (the chain splits its products iff do is float32); mixed dtypes keep the scan over dhu_local's B_c.
inline bool gla_dh_chain_applies(const BwdParams& bp) {
  const ChunkParams& p = bp.c;
  const bool all32 = p.q.dt == kF32 && p.k.dt == kF32 && p.v.dt == kF32;
  const bool all16 = is_16bit(p.q.dt) && is_16bit(p.k.dt) && is_16bit(p.v.dt);
  const bool do_ok = (bp.d_o.dt == kF32 && all32) || (is_16bit(bp.d_o.dt) && all16);
  const int64_t es = bp.d_o.dt == kF32 ? 4 : 2;  // its rows are copied 16 bytes at a time, as v's
  const bool do_aligned = reinterpret_cast<uintptr_t>(bp.d_o.p) % 16 == 0 && (bp.d_o.st * es) % 16 == 0 &&
                          (bp.d_o.sx * es) % 16 == 0;
  // The chain carries dh / scale from d_final_state / scale (Problem::validate: scale > 0, finite):
  // a float scale far from 1 could overflow or lose that quotient, so such calls take the scan.
  const bool scale_ok = p.scale >= 0x1p-30f && p.scale <= 0x1p30f;
  return p.gla && bp.d_o.p && do_ok && do_aligned && scale_ok && bp.keep && bp.init == kInitZero && bp.Vw == p.V &&
         p.K % 32 == 0 && p.V % 32 == 0 && p.qg && p.kg && p.kg == bp.dkv && bp.dh;
}

// gdn's dhu reads k itself (bfloat16 rows, exact TF32 operands) and applies kg's row factor
// rstd_k 2^(b_end - b_r) to the product, dvnew = A_c + Diag(f) (k dh), instead of reading the float32
// kg that dhu_local would write for it: half the bytes a chain step copies for that operand, no kg
// round trip through memory, and no TF32 rounding of kg (k is exact in TF32; the factor multiplies in
// float32). Both kernels evaluate this one predicate, so dhu_local writes kg exactly when dhu reads it.
__host__ __device__ __forceinline__ bool dhu_reads_raw_k(const ChunkParams& p) {
  return !p.kda && !p.gla && p.k.dt == kBF16 && rows_vec16(p.k, 8) && p.K % 8 == 0;
}

// The backward's products split into 3xTF32 (float32 accuracy, tile_mma.cuh) when an input it reads
// is float32 (q, k, v, do) or in the CP transition's chain (dhu with kInitTransition: M^T stays
// float32-accurate, as the forward's M; the transition's chunk-local terms, dhu_local, run before
// init is set and follow the input rule); with 16-bit inputs one TF32 product, the forward's rule:
// operands that are not inputs (P, h, dh, vnew, dvnew, the gated k and q) are rounded to TF32
// (validation/tolerance.h kCudaTf32), finer than FLA, which stores them in bf16.
inline bool bwd_split_products(const BwdParams& bp) {
  return bp.c.q.dt == kF32 || bp.c.k.dt == kF32 || bp.c.v.dt == kF32 || (bp.d_o.p && bp.d_o.dt == kF32) ||
         bp.init == kInitTransition;
}

// Pipeline::backward's local pass for gdn with bfloat16 q, k and do (dhu_reads_raw_k, unsplit products,
// the V columns kept from a zero or d_final_state start): dhu forms A_c and B_c inside its chain (B_c
// as FLA's dhu forms q^T do) instead of reading the float32 A_c [TT,HV,V] and B_c [NT,HV,K,V] that
// dhu_local would write and dhu read back through memory (at T = 32768, H = 16: 268 and 537 MB each
// way). Set once per call (BwdParams::dhu_forms_local); dhu_local then does not run. The transition
// backward and backward_prepare keep the terms in memory (the CP layer reuses them).
inline bool dhu_forms_local_applies(const BwdParams& bp) {
  const ChunkParams& p = bp.c;
  return dhu_reads_raw_k(p) && !bwd_split_products(bp) && bp.d_o.p && bp.d_o.dt == kBF16 && rows_vec16(bp.d_o, 8) &&
         p.q.dt == kBF16 && rows_vec16(p.q, 8) && bp.keep && bp.init == kInitZero && bp.Vw == p.V && bp.dh;
}

// dh where the reverse walk starts (the last chunk's end), for dhu and gla's scan: d_final_state or
// 0; with kInitTransition the identity in M^T's columns (from V, after dS_ext's).
__device__ __forceinline__ float dhu_init(const BwdParams& bp, int n, int hv, int i, int col) {
  if (bp.init == kInitTransition) return i == col - bp.c.V ? 1.0f : 0.0f;
  if (bp.dht.p) return load_any(bp.dht.p, bp.dht.dt, n * bp.dht.sn + hv * bp.dht.shv + i * bp.dht.si + col * bp.dht.sj);
  return 0.0f;
}

// The backward launchers' dispatch: f(kd, split) with the call's K and bwd_split_products as
// compile-time constants (std::integral_constant<int, KD>, std::bool_constant).
template <class F>
void dispatch_bwd(const BwdParams& bp, F&& f) {
  dispatch_key_dim(bp.c.K, [&](auto kd) { dispatch_bool(bwd_split_products(bp), [&](auto split) { f(kd, split); }); });
}

// dhu: the chunk-local terms (grid (NT, HV)), then the serial recurrence (grid (N, HV, Vw/BV), BV = 16 or 32).
void launch_bwd_dhu_local(const BwdParams& bp, cudaStream_t stream);
void launch_bwd_dhu_serial(const BwdParams& bp, cudaStream_t stream);
// gla's part 2 (chunk_bwd_dh_gla.cu; launch_bwd_dhu_serial sends gla there): the elementwise scan of
// dh, then dvnew += kg dh[c] in parallel over the chunks.
void launch_bwd_dhu_gla(const BwdParams& bp, cudaStream_t stream);
// chunk: kernels hv (NT, HV, 2) -> wy (NT, HV) -> intra (NT HV K/32 blocks; gla: its anchored kernel first; gdn:
// wy and intra as one kernel on (NT, HV)) -> partial sums.
void launch_bwd_chunk(const BwdParams& bp, cudaStream_t stream);
void launch_bwd_hv(const BwdParams& bp, cudaStream_t stream);
void launch_bwd_wy(const BwdParams& bp, cudaStream_t stream);  // gla: nothing (no WY backward)
void launch_bwd_wy_kernel(const BwdParams& bp, cudaStream_t stream);  // kda's (gdn's runs in launch_bwd_intra_gdn)
void launch_bwd_intra(const BwdParams& bp, cudaStream_t stream);
void launch_bwd_intra_gdn(const BwdParams& bp, cudaStream_t stream);  // gdn's wy + intra kernel (one slot of da partials)
void launch_bwd_intra_gla_anchored(const BwdParams& bp, cudaStream_t stream);  // gla's, one anchor per chunk
void launch_bwd_chunk_sum(const BwdParams& bp, cudaStream_t stream);  // gla: nothing to sum
// finish: the fused input transforms backward and the gradients in their dtypes.
void launch_bwd_finish(const BwdParams& bp, cudaStream_t stream);

}  // namespace kcp::cuda
