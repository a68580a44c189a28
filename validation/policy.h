// The per-tensor comparison policy for dumped results against the oracle: which bar a tensor must
// meet, chosen by who produced it, the dtype of the call's inputs, the dtype it was stored in, and
// which output/state/gradient it is. All numbers come from tolerance.h; judge() applies one bar to
// one compare() result. The table is in docs/GOLDEN.md.
//   token_f32: FLA's naive float32 token recurrence (group fla_naive)
//   kernel:    a chunked / low-precision kernel (fla_chunk, Megatron captures, any unknown group)
//   kcp:       a kcp backend's results written by `kcp run` / `kcp check --write` (group attribute
//              producer = "kcp", compute = float64 | float32)
// Covered by tests/validation/test_policy.cpp.
#pragma once

#include <string>
#include <string_view>

#include "core/dtype.h"
#include "validation/compare.h"

namespace kcp::val {

enum class Producer { token_f32, kernel, kcp_f64, kcp_f32 };
std::string_view producer_name(Producer p);

// From a result group's name and its attributes producer / compute (empty when absent).
Producer producer_of(std::string_view group, std::string_view producer_attr, std::string_view compute_attr);

struct Bar {
  double ratio = 0;        // bound on fla_ratio = rms(a-b) / (rms(b) + 1e-8)
  bool warn_only = false;  // exceeding it warns and does not fail (FLA's own warning-only bars)
  bool abs_pass = false;   // FLA's rule: pass when max|a-b| <= tol::kFlaAbsPass
  const char* reason = "";
};

// op: gdn, kda, gla, conv1d; tensor: o, final_state, dq, ..., y, dx, ...; `stored`: the dataset's
// source dtype (its dtype attribute); `input`: the call's input dtype.
Bar bar_for(Producer p, std::string_view op, std::string_view tensor, DType stored, DType input);

enum class Verdict { pass, warn, fail, skip };
std::string_view verdict_name(Verdict v);  // "PASS", "WARN", "FAIL", "SKIP"

// Any NaN, or an Inf not matched by the same Inf, fails; then the bar.
Verdict judge(const Metrics& m, const Bar& bar);

}  // namespace kcp::val
