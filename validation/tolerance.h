// Every threshold kcp judges with, in one place, each with the reason for its value.
// Measures (compare.h): rel_l2 = ||a-b|| / ||b||; fla_ratio = rms(a-b) / (rms(b) + 1e-8), FLA's
// err_ratio. A bar that a tensor misses is never loosened here without a written reason.
#pragma once

namespace kcp::val::tol {

// --- the oracle itself --------------------------------------------------------------------------
// Central finite differences of L in float64 with step h: truncation error O(h^2 * L''') ~ 1e-10
// and rounding error O(eps * |L| / h) ~ 1e-11 at h = 1e-5, so a correct gradient lands near 1e-9;
// 1e-6 is the bar and leaves three orders of margin without hiding a wrong term (a missing
// term shows up at 1e-3 .. 1).
inline constexpr double kFdStep = 1e-5;
inline constexpr double kFdRel = 1e-6;

// Two exact algorithms in float64 (chunkwise vs recurrence, CP vs single process): they differ only
// by rounding accumulated over O(T) steps of O(K) sums, ~1e-14 .. 1e-12 observed; the bar 1e-10 is
// the and is far below any algorithmic error (a wrong chunk boundary gives > 1e-3).
inline constexpr double kExactF64 = 1e-10;

// Identities that hold exactly in exact arithmetic and are computed along different paths in
// float64 (kda with equal gates vs gdn, packed vs one by one, GVA vs repeated heads).
inline constexpr double kIdentityF64 = 1e-12;

// Element-wise float64 comparisons of values computed along two paths of a few dozen operations on
// unit-scale numbers (hand-worked steps, closed forms, a conv split at a halo): rounding is ~1e-16
// per operation, ~1e-15 accumulated; 1e-13 leaves margin and still fails on any wrong term.
inline constexpr double kElementF64 = 1e-13;

// float32 vs float64 of the same recurrence on inputs of unit scale: float32 rounding (6e-8)
// accumulated over the short test sequences gives ~1e-6 observed; 1e-4 still fails on any error
// larger than float rounding (a dropped term is O(1)).
inline constexpr double kFloatVsDouble = 1e-4;

// The float32 rule for faster algorithms (validation/float_rule.h, docs/ALGORITHMS.md section 6): err(candidate, oracle_f64) must be at most
// kFloatRuleFactor * err(float32 recurrence, oracle_f64) + kFloatRuleFloor. The floor covers a
// baseline that happens to be nearly exact (one float32 rounding of unit values is 6e-8).
inline constexpr double kFloatRuleFactor = 2.0;
inline constexpr double kFloatRuleFloor = 1e-6;
// cuda-chunkwise runs float32 products as 3xTF32 (split operands: ~2^-21 relative per product against
// float32's 2^-24, kCudaTf32's note below). Where its float32 results are judged by the float32 rule
// itself (the CP sweep's rows on the GPU, validation/float_rule.h with Device::cuda) the floor is
// scaled by that ratio, 8. On the H100 (2026-11-26, `cp-sweep` full over NCCL at N = 2 and 4, the
// unscaled floor) the backend alone missed the rule on 34 of its float32 cases (o, ht, dk ~1.3e-6 ..
// 3.8e-6 on the 1.2e-6 bar), and 6 CP rows, which run the same kernels again for each part's
// transition and merge them, failed at 1.1 .. 2.7x the bar (ht 6.3e-6, o 2.0e-6, dbeta 3.3e-6 ..
// 4.7e-6; cpu-chunkwise float32 gives ~1.3e-7 on the same rows). 8e-6 stays three orders of magnitude
// below a CP mistake (a lost state or a halo from the wrong rank is O(1e-2 .. 1)).
inline constexpr double kSplitTf32FloorFactor = 8.0;
// For the gate gradients (dg sums products of the state and its gradient; dA_log and ddt_bias sum dg
// over every token; their terms cancel) the floor is multiplied by the sum's condition number
// (validation/float_rule.h): their float32 rounding is relative to the magnitude summed. Without it,
// an exact algorithm that sums in another order (chunkwise: pieces larger than the per-token
// gradient; CP: states merged from float32 transitions, a sum split over ranks) fails the 2x factor
// on some seeds although it is as accurate as float32 allows.
// The layer rows of the CP sweep (app/cp_sweep_layer.h) use the same rule with this floor in place of
// kFloatRuleFloor (validation/float_rule.h layer_float_rule_bar). The layer normalises every token
// (L2 norm of q and k per head, RMSNorm of o per head) and sums per-token gate gradients into the g
// projection's weights, so a float32 rounding relative to the magnitudes involved is scaled up where a
// head vector or a sum is small. On layouts of a few dozen tokens the 2x factor absorbs that (err/bar
// <= 0.62 over 25 seeds x P = 2..4 with the 1e-6 floor); on the tiny layout (T = 3, a sequence cut
// after its first token) each error is a handful of such roundings, and CP's exceeded twice the
// baseline's by up to 5.7e-6 (100 seeds, P = 2, 3; e.g. dg_proj.lora_a 5.9e-6 against a baseline of
// 1.7e-7). 1e-5 covers that with margin, stays 10x below kLayerF32 (a float32 layer dump's bar) and
// far below any CP mistake (a halo row from the wrong rank or a lost state is O(1e-2 .. 1)).
inline constexpr double kLayerFloatRuleFloor = 1e-5;

// Intra-card CP (segment/, issue 12): a forward cut into chunk-aligned segments keeps the chunk
// grid, so in exact arithmetic it is the unsplit function; in float64 it is judged by kExactF64
// (only the summation order changes: the segments' states come from (S_ext, M) products instead of
// the chained state). In float32 the bar is two-fold: the float32 rule against the oracle
// (above), and no worse than twice the error of the same backend run unsplit (plus
// kFloatRuleFloor, for an unsplit run that happens to be nearly exact): the merge adds a few float32
// products of M per segment, whose rounding is of the state's own order, so a 2x margin still fails
// on any wrong term (a dropped h0 or a state started from the wrong segment is O(1)).
inline constexpr double kSegmentedVsUnsplitFactor = 2.0;

// --- a layer dump against the float64 layer oracle (validation/layer_check.h), on fla_ratio --------
// A float64 producer differs from the oracle only by rounding order (chunkwise kernel, other sums).
inline constexpr double kLayerF64 = kExactF64;
// A float32 producer: float32 rounding (6e-8) through projections, conv, norms, the kernel and the
// gated norm on unit-scale values stays near 1e-6 (observed on the named cases, docs/LAYER.md); the
// bar of kFloatVsDouble still fails on a wrong term (a 1% planted error gives 1e-2).
inline constexpr double kLayerF32 = kFloatVsDouble;
// Tensors stored in bfloat16 between stages (relative rounding 2^-9 per storage, a few storages per
// stage): FLA's bar for its least precise kernel outputs (dg, dbeta), kFlaChunkGateBeta.
inline constexpr double kLayerBf16 = 0.02;
inline constexpr double kLayerF16 = kLayerBf16 / 8;  // 3 more mantissa bits than bfloat16

// --- against FLA (golden dumps, docs/GOLDEN.md) ---------------------------------------------------
// Oracle vs fla_naive (FLA's float32 token recurrence): float32 rounding over <= 256 tokens lands
// near 1e-7 .. 1e-6; the bar is 1e-5.
inline constexpr double kGoldenNaiveF32 = 1e-5;
// Where FLA rounded the stored tensor to bfloat16 (8 mantissa bits, relative rounding 2^-9 = 2e-3
// worst case, ~1e-3 rms), the bar is 3e-3.
inline constexpr double kGoldenNaiveBf16 = 3e-3;
// FLA's own thresholds for its chunk kernels against its token reference (tests/ops/test_kda.py,
// test_gated_delta.py), ALGORITHMS.md section 6.
inline constexpr double kFlaChunkOutput = 0.005;    // o, final_state
inline constexpr double kFlaChunkGrad = 0.008;      // dq, dk, dv, dinitial_state
inline constexpr double kFlaChunkGateBeta = 0.02;   // dg, dbeta, dA_log, ddt_bias (fused gate)
// FLA's per-rank CP transitions (validation/cp_transition_check.h) come from the same float32 chunk
// chain as ht / dh0 (its bf16 w, u, gated k, float32 products of the per-chunk maps): S_ext, M and M^T
// are held to kFlaChunkOutput (ht's), dS_ext to kFlaChunkGrad (dh0's), with FLA's absolute pass.
// KDA's test_chunk is stricter on the fused-gate parameters than GDN's: ddt_bias 0.008, and dA_log
// 0.003 as a warning only (FLA does not fail on it; docs/ALGORITHMS.md section 6). GDN keeps kFlaChunkGateBeta.
inline constexpr double kFlaChunkKdaDtBias = 0.008;
inline constexpr double kFlaChunkKdaALogWarn = 0.003;
// FLA's assert_close passes a tensor at once when max|ref - x| <= 1e-6, whatever the ratio: a tensor
// that is zero up to float32 noise has a meaningless ratio. Applied to kernel producers only, as FLA does.
inline constexpr double kFlaAbsPass = 1e-6;
// Tensors stored as float16 by a float32 token recurrence: the bfloat16 argument above with 3 more
// mantissa bits (relative rounding 2^-12 worst case), so kGoldenNaiveBf16 / 8.
inline constexpr double kGoldenNaiveF16 = kGoldenNaiveBf16 / 8;
// The per-tensor policy that picks among these (producer x input dtype x stored dtype x tensor) is
// validation/policy.cpp; docs/GOLDEN.md lists it as a table.

// --- cuda-chunkwise against the float64 oracle ----------------------------------------------------
// 16-bit inputs (bf16, fp16): products run on tensor cores that round each operand that is not an
// input (P, w, the state, vnew, gated k/q) to at worst TF32's 11 significant bits (unit roundoff
// 2^-11 = 4.9e-4; the folded gdn state kernel carries the state and vnew as 16-bit hi + lo parts,
// ~16 bits, and kkt's gdn dots are exact 16-bit products, both finer); inputs are exact and all sums
// are float32. A few such roundings in sequence (kkt -> P -> w -> vnew -> S -> o) stay below 1e-3:
// observed on an H100 (2026-11-22) at most 5.0e-4 over the forward sweep, the stage tests and the
// transitions; a wrong term is O(1) and a dropped decay >= 1e-2 on these cases (0.4 .. 1.5 seen
// with the decay planted out of the folded kernel). Applies to o written in float32, to the final
// state (float32) and to every stage result.
inline constexpr double kCudaTf32 = 1e-3;
// float32 inputs run every product as 3xTF32 (split operands, ~2^-21 relative): float32 arithmetic,
// judged by kFloatVsDouble above. o written in bf16/fp16 adds its own rounding (bf16: ~1.6e-3 rms
// relative) on top of kCudaTf32: judged by FLA's own bar for its chunk kernels, kFlaChunkOutput.

}  // namespace kcp::val::tol
