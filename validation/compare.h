// compare(): one set of error measures between a candidate tensor and a reference, used by the CLI
// and every test. Both are host views of any dtype and the same shape; values are widened to double.
//   max_abs (and where), rel_l2 = ||a-b||/||b||, fla_ratio = rms(a-b)/(rms(b)+1e-8) (FLA's
//   err_ratio), cosine similarity, max distance in bfloat16 ULPs, NaN/Inf counts on each side, and
//   how many of the candidate's nonzero finite values are bfloat16 numbers (rounded_to_bf16()).
// first_mismatches() lists the first disagreeing elements for a failure report.
// Covered by tests/validation/test_policy.cpp and every suite that judges a result.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace kcp::val {

struct Metrics {
  int64_t n = 0;
  double max_abs = 0;
  Shape max_abs_at;            // multi-index of the largest |a-b|
  double a_at = 0, b_at = 0;   // the two values there
  double rel_l2 = 0;           // ||a-b|| / ||b|| (0 when both are zero)
  double fla_ratio = 0;        // rms(a-b) / (rms(b) + 1e-8)
  double cosine = 1;           // a.b / (|a||b|) (1 when both are zero)
  double max_bf16_ulp = 0;     // after rounding both to bfloat16 (RNE)
  double ref_rms = 0;
  int64_t nan_a = 0, nan_b = 0, inf_a = 0, inf_b = 0;
  int64_t inf_mismatch = 0;    // Inf on one side without the same Inf on the other
  int64_t a_nonzero = 0;       // nonzero finite values of a
  int64_t a_bf16_exact = 0;    // ... of which exactly representable in bfloat16
  bool finite_ok() const { return nan_a == 0 && nan_b == 0 && inf_mismatch == 0; }
  // Every nonzero value of a (at least 16 of them) is a bfloat16 number: a float32 (or wider) result
  // that went through bf16 somewhere. A float32 value is bf16-exact with probability 2^-16, so 16 such
  // values by chance are out of the question.
  bool rounded_to_bf16() const { return a_nonzero >= 16 && a_bf16_exact == a_nonzero; }
};

Metrics compare(const TensorView& a, const TensorView& b);

// The first `max_count` elements, in memory order, where a and b disagree: a NaN on either side, an
// Inf not matched by the same Inf, or |a-b| > abs_threshold. Printed under a failing tensor.
struct Mismatch {
  Shape at;
  double a = 0, b = 0;
};
std::vector<Mismatch> first_mismatches(const TensorView& a, const TensorView& b, double abs_threshold, int max_count);

// A multi-index as "(b,t,h,i)".
std::string index_str(const Shape& idx);

}  // namespace kcp::val
