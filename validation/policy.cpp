// bar_for / judge: the policy table of policy.h, each branch with the reason printed next to it.
#include "validation/policy.h"

#include "validation/tolerance.h"

namespace kcp::val {
namespace {

// The rounding floor of a tensor stored in `t` by a producer computing in float32.
Bar storage_bar(DType t) {
  switch (t) {
    case DType::bf16:
      return {tol::kGoldenNaiveBf16, false, false, "float32 math, tensor rounded to bfloat16 (2^-9 relative)"};
    case DType::f16:
      return {tol::kGoldenNaiveF16, false, false, "float32 math, tensor rounded to float16 (2^-12 relative)"};
    default: return {tol::kGoldenNaiveF32, false, false, "float32 token recurrence, <= 256 steps of rounding"};
  }
}

bool one_of(std::string_view x, std::initializer_list<std::string_view> set) {
  for (std::string_view s : set)
    if (x == s) return true;
  return false;
}

// FLA's thresholds for its chunk kernels against its float32 token reference (tests/ops/test_kda.py,
// test_gated_delta.py; docs/ALGORITHMS.md section 6). They hold for float32 inputs too: FLA's float32 path
// runs its dots in TF32 (10-bit mantissa), so its error is of the bf16 kind.
Bar kernel_bar(std::string_view op, std::string_view tensor) {
  if (one_of(tensor, {"o", "final_state"})) return {tol::kFlaChunkOutput, false, true, "FLA test_chunk: o, ht"};
  if (one_of(tensor, {"dq", "dk", "dv", "dinitial_state"}))
    return {tol::kFlaChunkGrad, false, true, "FLA test_chunk: dq, dk, dv, dh0"};
  if (op == "kda" && tensor == "dA_log")
    return {tol::kFlaChunkKdaALogWarn, true, true, "FLA test_kda: dA 0.003, warning only"};
  if (op == "kda" && tensor == "ddt_bias") return {tol::kFlaChunkKdaDtBias, false, true, "FLA test_kda: dbias"};
  return {tol::kFlaChunkGateBeta, false, true, "FLA test_chunk: dg, dbeta (GDN: dA_log, ddt_bias)"};
}

}  // namespace

std::string_view producer_name(Producer p) {
  switch (p) {
    case Producer::token_f32: return "token-f32";
    case Producer::kernel: return "kernel";
    case Producer::kcp_f64: return "kcp-f64";
    case Producer::kcp_f32: return "kcp-f32";
  }
  return "?";
}

Producer producer_of(std::string_view group, std::string_view producer_attr, std::string_view compute_attr) {
  if (producer_attr == "kcp") return compute_attr == "float32" ? Producer::kcp_f32 : Producer::kcp_f64;
  if (group == "fla_naive") return Producer::token_f32;
  return Producer::kernel;
}

Bar bar_for(Producer p, std::string_view op, std::string_view tensor, DType stored, DType input) {
  // conv1d: at most W float32 multiply-adds per y/dx element (T for dweight/dbias) and no TF32 or
  // 16-bit intermediates in FLA's kernel, so every producer gets the token-recurrence bars.
  if (op == "conv1d" && (p == Producer::token_f32 || p == Producer::kernel)) return storage_bar(stored);
  switch (p) {
    case Producer::token_f32: return storage_bar(stored);
    case Producer::kernel:
      // A kernel fed float64 (a user's own float64 implementation) must be exact up to rounding.
      if (input == DType::f64 && stored == DType::f64)
        return {tol::kExactF64, false, false, "float64 inputs and outputs: two exact algorithms"};
      return kernel_bar(op, tensor);
    case Producer::kcp_f64:
      if (stored == DType::bf16 || stored == DType::f16) return storage_bar(stored);
      return {tol::kExactF64, false, false, "kcp float64 backend: two exact algorithms in float64"};
    case Producer::kcp_f32:
      if (stored == DType::bf16 || stored == DType::f16) return storage_bar(stored);
      return {tol::kFloatVsDouble, false, false, "kcp float32 backend vs the float64 oracle"};
  }
  return storage_bar(stored);
}

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::pass: return "PASS";
    case Verdict::warn: return "WARN";
    case Verdict::fail: return "FAIL";
    case Verdict::skip: return "SKIP";
  }
  return "?";
}

Verdict judge(const Metrics& m, const Bar& bar) {
  if (!m.finite_ok()) return Verdict::fail;
  if (bar.abs_pass && m.max_abs <= tol::kFlaAbsPass) return Verdict::pass;
  if (m.fla_ratio <= bar.ratio) return Verdict::pass;
  return bar.warn_only ? Verdict::warn : Verdict::fail;
}

}  // namespace kcp::val
