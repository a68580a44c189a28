// Chunkwise (WY) algorithm per (sequence, value head), stage by stage as FLA runs it (ALGORITHMS.md
// 4.1-4.13, CP summaries 5.2-5.4). Chunk c holds tokens [cC, min(cC+C, L)); every per-chunk matrix
// has exactly len = min(C, L-cC) rows (no padding). With B = chunk-local cumsum of the log decay a:
//   Lmat = strict_lower(beta_r sum_d k_r k_s exp(B_r-B_s)) ; P = (I+Lmat)^-1 ; w = P (beta k Gamma)
//   u = P (beta v) ; vnew = u - w h[c] ; h[c+1] = Diag(Gamma_end) h[c] + kg^T vnew ; kg = k E
//   o = scale (q Gamma) h[c] + Aqk vnew,  Aqk = lower_incl(scale sum_d q_r k_s exp(B_r-B_s))
// gla has no kkt/solve/WY: u = v, w is empty, vnew = v. gdn's gate is one column (Kg = 1).
// Covered by tests/chunkwise/ (against the token recurrence, stage identities, CP primitives).
//
// For a CUDA developer, the CPU twin of every stage for sequence n, value head hv, chunk c:
//   Problem p = make_problem(...);  HeadData<S> d = load_head<S>(p, inputs, n, hv);   (head_io.h)
//   ChunkwiseTrace<S> t = chunkwise_forward_trace(p, d);
//     t.chunk[c].gate.B (natural log; FLA's g_cumsum = B / ln 2), .Lmat, .P, .Aqk, .w, .u, .kg, .qg,
//     t.h[c] (state entering c), t.vnew[c], t.o[c] (rows of chunk c), t.ht.
//   ChunkwiseBackwardTrace<S> b = chunkwise_backward_trace(p, d, d_o_rows, dht);
//     b.dh[c] (gradient of the state LEAVING c), b.chunk[c].dAqk, .dv_loc, .dvnew, .dh_in, .dq_inter,
//     .dk_inter, .dB_q, .dB_kg, .dB_all, .dw, .dXu, .dXw, .dP, .dL, .dv, .dk_wy, .dbeta_wy, .dB_wy,
//     .dq_intra, .dk_intra, .dbeta_intra, .dB_intra, .da_intra; b.grads (HeadGrads, as the recurrence's).
//   One stage alone: ChunkInputs<S> x = chunk_inputs(d, chunk_span(d.seq.len, p.chunk_size, c)), then
//   chunk_gate_cumsum(x.a), chunk_kkt(...), ..., with the previous stage's outputs taken from the trace.
// States are K-major [K,V] here whatever state_v_first says; FLA's h/dh are [NT,HV,K,V] (or V,K).
// Two numerical choices differ from FLA's kernels (same function, float32 as accurate as the token
// recurrence): the gate cumsum is accumulated in float64, and the gate gradient is formed without
// FLA's cancelling reverse cumsum (chunk_gate_cumsum_backward, gated_gram_backward); FLA's per-row
// dB pieces are still given (fla_dB_inter, dB_wy, dB_intra) for comparing its kernels.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "reference/head_io.h"

namespace kcp::ref {

// The chunk sizes this implementation (and FLA) supports; supports() and the entry points check
// against this list. The per-channel intra-chunk products work on sub-chunks of kSubChunk rows.
inline constexpr std::array<int64_t, 3> kChunkwiseChunkSizes = {16, 32, 64};
inline constexpr int64_t kSubChunk = 16;
// Empty when C is supported, else the reason ("chunk_size 48: cpu-chunkwise supports 16, 32, 64").
std::string chunkwise_chunk_size_error(int64_t C);
// Throws that reason when p.chunk_size is not supported (every per-head entry point calls it).
void check_chunkwise_chunk_size(const Problem& p);

struct ChunkSpan {
  int64_t t0 = 0, len = 0;  // first token (inside the sequence), rows
};
inline int64_t chunk_count(int64_t L, int64_t C) { return (L + C - 1) / C; }
inline ChunkSpan chunk_span(int64_t L, int64_t C, int64_t c) { return {c * C, std::min(C, L - c * C)}; }

// The rows of one chunk, copied out of HeadData.
template <class S>
struct ChunkInputs {
  Mat<S> q, k;   // [len,K]
  Mat<S> v;      // [len,V]
  Mat<S> a;      // [len,Kg] natural-log decay per token
  Vec<S> beta;   // [len] (empty for gla)
};
template <class S> ChunkInputs<S> chunk_inputs(const HeadData<S>& d, ChunkSpan s);

// ---- forward stages --------------------------------------------------------------------------------

// Stage gate cumsum (FLA chunk_local_cumsum). Natural-log units; FLA stores b = B / ln 2 (log2).
// The cumsum is accumulated in float64 for every S and each decay factor below is exp of a float64
// difference: a float32 cumsum carries an absolute error ~ eps |B|, which becomes the relative error
// of every exp(B_r - B_s) (1e-5 for |B| ~ 100, strong gates), far worse than the recurrence.
// `sub_*`, `cross` are the sub-chunk anchor factors the per-channel intra-chunk products use (every
// exponent <= 0, so nothing overflows for any decay): sub_row[r] = exp(B_r - B_{n_b}) for r in
// sub-chunk b (n_b its first row), sub_col[s] = exp(B_{n_{b+1}} - B_s) (zero in the last sub-chunk),
// cross[i*nsub + j] = exp(B_{n_i} - B_{n_{j+1}}) for j < i, step[r] = exp(a_r).
// gdn (Kg = 1) instead keeps decay [len,len] = exp(B_r - B_s) for s <= r.
template <class S>
struct ChunkGate {
  Mat<S> B;             // [len,Kg] B_r = sum_{s<=r} a_s (rounded to S from the float64 cumsum)
  Mat<S> gamma;         // [len,Kg] exp(B_r): decay from the chunk start through row r
  Mat<S> e;             // [len,Kg] exp(B_end - B_r): decay after row r to the chunk end
  RowVec<S> gamma_end;  // [Kg] exp(B_end)
  Mat<S> sub_row, sub_col, step;  // [len,K] (per-channel gates only)
  std::vector<RowVec<S>> cross;   // [nsub*nsub] of [K] (per-channel gates only)
  Mat<S> decay;                   // [len,len] (scalar gate only), upper part zero
};
template <class S> ChunkGate<S> chunk_gate_cumsum(const Mat<S>& a);

// Stage kkt (FLA chunk_scaled_dot_kkt_fwd / the kkt half of chunk_kda_fwd_intra):
// Lmat[r,s] = beta_r sum_d k_r[d] k_s[d] exp(B_r[d]-B_s[d]), s < r; zero on and above the diagonal.
template <class S> Mat<S> chunk_kkt(const Mat<S>& k, const Vec<S>& beta, const ChunkGate<S>& g);
// Aqk[r,s] = scale sum_d q_r[d] k_s[d] exp(B_r[d]-B_s[d]), s <= r (KDA: chunk_kda_fwd_intra; GLA:
// chunk_gla_fwd_intra; GDN forms the same matrix inside chunk_fwd_o).
template <class S> Mat<S> chunk_aqk(const Mat<S>& q, const Mat<S>& k, const ChunkGate<S>& g, S scale);
// Stage solve_tril: P = (I + Lmat)^-1, unit lower triangular (FLA's A / Akk after solve_tril).
template <class S> Mat<S> chunk_solve_tril(const Mat<S>& Lmat);

// Everything of one chunk that does not depend on the state (stages gate cumsum .. WY).
template <class S>
struct ChunkLocal {
  ChunkGate<S> gate;
  Mat<S> Lmat, P;  // [len,len] (delta rule only)
  Mat<S> Aqk;      // [len,len] lower incl. diagonal, contains scale
  Mat<S> w;        // [len,K] P (beta k Gamma)  (delta rule only; empty for gla)
  Mat<S> u;        // [len,V] P (beta v); gla: v
  Mat<S> kg;       // [len,K] k E   (FLA's kg for KDA; GDN applies E to vnew instead, same product)
  Mat<S> qg;       // [len,K] q Gamma
};
// Stage WY (FLA recompute_w_u_fwd) fills w, u, kg, qg of `loc` from P and the gate.
template <class S> void chunk_wy(const ChunkInputs<S>& x, ChunkLocal<S>& loc);
// gate cumsum, kkt, Aqk, solve_tril and WY of one chunk.
template <class S> ChunkLocal<S> chunk_local_forward(const Problem& p, const ChunkInputs<S>& x);

// Stage state recurrence, one chunk (FLA chunk_gated_delta_rule_fwd_h):
// vnew = u - w h ; h_next = Diag(gamma_end) h + kg^T vnew.
template <class S>
void chunk_state(const ChunkLocal<S>& loc, const Mat<S>& h, Mat<S>& vnew, Mat<S>& h_next);
// Stage output (FLA chunk_fwd_o / chunk_gla_fwd_o_gk): o = scale qg h + Aqk vnew   [len,V]
template <class S> Mat<S> chunk_output(const ChunkLocal<S>& loc, const Mat<S>& h, const Mat<S>& vnew, S scale);
// Stages state and output together, as the per-head forward runs them: the same vnew, h_next and o,
// with w h and qg h taken as one product [w; qg] h (one pass over h, a GEMM twice as tall).
// `work` is scratch the caller keeps across chunks.
template <class S>
void chunk_state_output(const ChunkLocal<S>& loc, const Mat<S>& h, S scale, Mat<S>& vnew, Mat<S>& h_next,
                        Eigen::Ref<Mat<S>> o, Mat<S>& work);
// M_c = Diag(gamma_end) - kg^T w  [K,K]: the chunk's affine map on the entering state (5.2).
template <class S> Mat<S> chunk_transition_matrix(const ChunkLocal<S>& loc);

// Every forward intermediate of one head (memory ~ L (K+V+C) + NT K V; for tests and debugging).
template <class S>
struct ChunkwiseTrace {
  std::vector<ChunkLocal<S>> chunk;  // [NT]
  std::vector<Mat<S>> h;             // [NT] [K,V] state entering chunk c
  std::vector<Mat<S>> vnew;          // [NT] [len,V]
  std::vector<Mat<S>> o;             // [NT] [len,V]
  Mat<S> ht;                         // [K,V] final state
};
template <class S> ChunkwiseTrace<S> chunkwise_forward_trace(const Problem& p, const HeadData<S>& d);

// ---- backward stages -------------------------------------------------------------------------------
// All per chunk; `dh` is the gradient of the state LEAVING the chunk (FLA's dh[c]). dB pieces are
// gradients w.r.t. the natural-log cumsum B [len,Kg] (channel-summed for gdn); da from them by
// chunk_gate_cumsum_backward.

// FLA chunk_kda_bwd_dAv / chunk_bwd_dv_local: dAqk[r,s] = scale (do_r . vnew_s), s <= r (FLA's
// convention: scale included, so dq_intra = sum_s dAqk[r,s] k_s D_rs); dv_loc = Aqk^T do.
template <class S> struct ChunkDAv { Mat<S> dAqk, dv_loc; };  // [len,len], [len,V]
template <class S>
ChunkDAv<S> chunk_bwd_dAv(const ChunkLocal<S>& loc, const Mat<S>& vnew, const Mat<S>& d_o, S scale);

// FLA chunk_gated_delta_rule_bwd_dhu, one chunk: dvnew = kg dh + dv_loc (dh before any decay);
// dh_in = Diag(gamma_end) dh + scale qg^T do - w^T dvnew (gradient of the state entering).
template <class S>
void chunk_state_backward(const ChunkLocal<S>& loc, const Mat<S>& dv_loc, const Mat<S>& d_o, const Mat<S>& dh,
                          S scale, Mat<S>& dvnew, Mat<S>& dh_in);

// The two products of one chunk's backward that read h^T, as one product [scale do; dXu] h^T:
//   do_hT = scale do h^T [len,K] (feeds dq_inter) ; dXu = P^T dvnew ; dXw = -dXu h^T (delta rule only,
//   for chunk_wy_backward; gla leaves both empty).
template <class S> struct ChunkHtProducts { Mat<S> do_hT, dXu, dXw; };
template <class S>
ChunkHtProducts<S> chunk_bwd_ht_products(const ChunkLocal<S>& loc, const Mat<S>& h, const Mat<S>& d_o,
                                         const Mat<S>& dvnew, S scale);
// FLA chunk_bwd_dqkwg (inter-chunk part; the first half of chunk_kda_bwd_wy_dqkg_fused), h = h[c]:
//   dq_inter = scale Gamma * (do h^T) = Gamma * do_hT ; dk_inter = E * (vnew dh^T)
//   gate pieces: dB_q = q dq_inter (through qg), dB_kg = k dk_inter (through kg = k exp(B_end - B_r)),
//   dB_all = gamma_end rowsum(h * dh) (through the chunk decay of h); see chunk_gate_cumsum_backward.
//   FLA's single dB_inter = dB_q - dB_kg + [r == end] (dB_all + sum_r dB_kg_r): fla_dB_inter().
template <class S> struct ChunkInterGrads {
  Mat<S> dq_inter, dk_inter;  // [len,K]
  Mat<S> dB_q, dB_kg;         // [len,Kg]
  RowVec<S> dB_all;           // [Kg]
};
template <class S>
ChunkInterGrads<S> chunk_inter_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& h,
                                        const Mat<S>& vnew, const Mat<S>& do_hT, const Mat<S>& dh);
template <class S> Mat<S> fla_dB_inter(const ChunkInterGrads<S>& in);
// FLA's dw = -dvnew h^T [len,K] (the gradient w.r.t. w). The head backward never forms it: it needs
// only P^T dw = -(P^T dvnew) h^T and dw (beta k Gamma)^T, both cheaper from dvnew (below).
template <class S> Mat<S> chunk_dw(const Mat<S>& dvnew, const Mat<S>& h);

// FLA prepare_wy_repr_bwd (second half of chunk_kda_bwd_wy_dqkg_fused), delta rule only:
//   dXu = P^T dvnew ; dXw = P^T dw = -dXu h^T (both taken from `hp`, chunk_bwd_ht_products) ;
//   dv = beta dXu ; dbeta_wy = v.dXu + (k Gamma).dXw ;
//   dk_wy = beta Gamma dXw ; dB_wy = beta k Gamma dXw ;
//   dP = strict_lower(dw (beta k Gamma)^T + dvnew (beta v)^T) = strict_lower(dvnew ((I + Lmat) vnew)^T)
//        (as (I + Lmat) vnew = beta v - beta k Gamma h) ; dL = -strict_lower(P^T dP P^T) (w.r.t. Lmat).
// gla: dv = dvnew, the rest empty.
template <class S> struct ChunkWYGrads { Mat<S> dXu, dXw, dv, dk_wy, dB_wy, dP, dL; Vec<S> dbeta_wy; };
template <class S>
ChunkWYGrads<S> chunk_wy_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& vnew,
                                  const Mat<S>& dvnew, ChunkHtProducts<S>&& hp);

// FLA chunk_kda_bwd_intra (GDN: the intra parts of chunk_bwd_dqkwg and prepare_wy_repr_bwd):
// the gradients through Aqk (from dAqk) and Lmat (from dL), D_rs = exp(B_r - B_s):
//   dq_intra_r = sum_{s<=r} dAqk[r,s] k_s D_rs
//   dk_intra_s = sum_{r>=s} dAqk[r,s] q_r D_rs + beta_s sum_{r<s} dL[s,r] k_r D_sr
//                + sum_{r>s} dL[r,s] beta_r k_r D_rs
//   dbeta_intra_r = k_r . sum_{s<r} dL[r,s] k_s D_rs
//   dB_intra = q dq_intra - k dk_(Aqk part) + beta k dkrow - k dkcol: FLA's per-row form (gdn: summed
//              over channels), whose reverse cumsum is the intra gate gradient in exact arithmetic;
//   da_intra = the same gradient w.r.t. a [len,Kg], as rectangle sums without cancellation
//              (chunkwise_intra.h); the head backward uses da_intra.
template <class S> struct ChunkIntraGrads { Mat<S> dq_intra, dk_intra, dB_intra, da_intra; Vec<S> dbeta_intra; };
template <class S>
ChunkIntraGrads<S> chunk_intra_backward(const ChunkInputs<S>& x, const ChunkLocal<S>& loc, const Mat<S>& dAqk,
                                        const Mat<S>& dL, S scale);

// The gate gradient of one chunk from the inter and WY pieces (w.r.t. a, [len,Kg]; no log2 factor):
//   da_t = sum_{r >= t} dB_rev_r + sum_{r < t} dB_kg_r + dB_all,  dB_rev = dB_q + dB_wy;
// the head backward adds da_intra. FLA takes one reverse cumsum of fla_dB_inter + dB_wy + dB_intra,
// equal in exact arithmetic, but there the kg piece enters as "chunk total minus suffix", which under
// strong decay (E_r tiny except near the chunk end) cancels every digit of da_t in float32.
template <class S>
Mat<S> chunk_gate_cumsum_backward(const Mat<S>& dB_rev, const Mat<S>& dB_kg, const RowVec<S>& dB_all);

// Every backward piece of one chunk.
template <class S>
struct ChunkBackward {
  Mat<S> dAqk, dv_loc;                         // chunk_bwd_dAv
  Mat<S> dvnew, dh_in;                         // chunk_state_backward
  Mat<S> dq_inter, dk_inter, dB_q, dB_kg;      // chunk_inter_backward
  RowVec<S> dB_all;
  Mat<S> dw;                                   // chunk_dw (traces only)
  Mat<S> dXu, dXw, dv, dk_wy, dB_wy, dP, dL;   // chunk_wy_backward
  Vec<S> dbeta_wy;
  Mat<S> dq_intra, dk_intra, dB_intra, da_intra;  // chunk_intra_backward
  Vec<S> dbeta_intra;
};
template <class S>
struct ChunkwiseBackwardTrace {
  std::vector<Mat<S>> dh;              // [NT] [K,V] gradient of the state leaving chunk c
  std::vector<ChunkBackward<S>> chunk;  // [NT]
  HeadGrads<S> grads;                   // assembled, as recurrent_backward_head returns them
};
template <class S>
ChunkwiseBackwardTrace<S> chunkwise_backward_trace(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                                   const Mat<S>& dht);

// ---- per-head algorithm (memory: chunk-local pieces + NT K V for the h[c]) ---------------------------
template <class S> void chunkwise_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht);
template <class S>
void chunkwise_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht,
                             HeadGrads<S>& g);
// CP primitives (5.2-5.4): s_ext = final state from zero, m = M_{NT-1} ... M_0; backward: ds_ext =
// bwd_dhu from zero at the end, m_t = M_0^T ... M_{NT-1}^T = M^T formed by the transposed chain.
template <class S>
void chunkwise_transition_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& s_ext, Mat<S>& m);
template <class S>
void chunkwise_transition_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                        Mat<S>& ds_ext, Mat<S>& m_t);

// The per-head algorithm as a "core" for the drivers in driver.h.
struct ChunkwiseCore {
  template <class S> void forward(const Problem& p, const HeadData<S>& d, Mat<S>& o, Mat<S>& ht) const {
    chunkwise_forward_head(p, d, o, ht);
  }
  template <class S>
  void backward(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, const Mat<S>& dht, HeadGrads<S>& g) const {
    chunkwise_backward_head(p, d, d_o, dht, g);
  }
  template <class S> void transition_forward(const Problem& p, const HeadData<S>& d, Mat<S>& s, Mat<S>& m) const {
    chunkwise_transition_forward_head(p, d, s, m);
  }
  template <class S>
  void transition_backward(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o, Mat<S>& ds, Mat<S>& mt) const {
    chunkwise_transition_backward_head(p, d, d_o, ds, mt);
  }
  static std::string unsupported(const Problem& p) { return chunkwise_chunk_size_error(p.chunk_size); }
};

}  // namespace kcp::ref
