// The comparison policy: which bar each (producer, op, tensor, stored dtype, input dtype) gets, and
// judge(): NaN and unmatched Inf fail, the ratio bar, FLA's warning-only bars and its absolute pass.
// Also compare()'s measures and first_mismatches() on hand-computable tensors.
#include <doctest/doctest.h>

#include <cmath>

#include "validation/compare.h"
#include "validation/policy.h"
#include "validation/tolerance.h"

using namespace kcp;
using namespace kcp::val;

namespace {

// Metrics of a candidate whose error relative to a unit reference is `ratio` (rms), spread evenly.
Metrics metrics_with_ratio(double ratio, double scale = 1.0) {
  Tensor<double> b({64}, scale), a({64});
  for (int64_t i = 0; i < 64; ++i) a.data()[i] = scale * (1.0 + (i % 2 ? ratio : -ratio));
  return compare(a.view(), b.view());
}

}  // namespace

TEST_CASE("producer of a result group") {
  CHECK(producer_of("fla_naive", "", "") == Producer::token_f32);
  CHECK(producer_of("fla_chunk", "", "") == Producer::kernel);
  CHECK(producer_of("megatron", "megatron-lm", "") == Producer::kernel);
  CHECK(producer_of("cpu-recurrent", "kcp", "float64") == Producer::kcp_f64);
  CHECK(producer_of("cuda-chunkwise", "kcp", "float32") == Producer::kcp_f32);
}

TEST_CASE("bars: token recurrence by stored dtype, kernels by tensor, kcp by precision") {
  for (DType in : {DType::f32, DType::bf16}) {
    CHECK(bar_for(Producer::token_f32, "gdn", "o", DType::f32, in).ratio == tol::kGoldenNaiveF32);
    CHECK(bar_for(Producer::token_f32, "kda", "dq", DType::bf16, in).ratio == tol::kGoldenNaiveBf16);
    CHECK(bar_for(Producer::token_f32, "kda", "dq", DType::f16, in).ratio == tol::kGoldenNaiveF16);
    CHECK(bar_for(Producer::kernel, "gdn", "o", DType::bf16, in).ratio == tol::kFlaChunkOutput);
    CHECK(bar_for(Producer::kernel, "kda", "final_state", DType::f32, in).ratio == tol::kFlaChunkOutput);
    for (const char* t : {"dq", "dk", "dv", "dinitial_state"})
      CHECK(bar_for(Producer::kernel, "kda", t, DType::bf16, in).ratio == tol::kFlaChunkGrad);
    for (const char* t : {"dg", "dbeta"})
      CHECK(bar_for(Producer::kernel, "gdn", t, DType::f32, in).ratio == tol::kFlaChunkGateBeta);
    CHECK(bar_for(Producer::kernel, "gdn", "dA_log", DType::f32, in).ratio == tol::kFlaChunkGateBeta);
    CHECK(bar_for(Producer::kernel, "kda", "ddt_bias", DType::f32, in).ratio == tol::kFlaChunkKdaDtBias);
    const Bar alog = bar_for(Producer::kernel, "kda", "dA_log", DType::f32, in);
    CHECK(alog.ratio == tol::kFlaChunkKdaALogWarn);
    CHECK(alog.warn_only);
    CHECK(bar_for(Producer::kernel, "conv1d", "dweight", DType::f32, in).ratio == tol::kGoldenNaiveF32);
  }
  CHECK(bar_for(Producer::kernel, "gdn", "o", DType::f64, DType::f64).ratio == tol::kExactF64);
  CHECK(bar_for(Producer::kcp_f64, "gdn", "dq", DType::f64, DType::bf16).ratio == tol::kExactF64);
  CHECK(bar_for(Producer::kcp_f32, "kda", "dg", DType::f32, DType::f32).ratio == tol::kFloatVsDouble);
  CHECK(bar_for(Producer::kcp_f64, "kda", "o", DType::bf16, DType::bf16).ratio == tol::kGoldenNaiveBf16);
  // FLA's absolute pass is FLA's rule for its kernels, not ours for token recurrences
  CHECK(bar_for(Producer::kernel, "gdn", "o", DType::f32, DType::f32).abs_pass);
  CHECK(!bar_for(Producer::token_f32, "gdn", "o", DType::f32, DType::f32).abs_pass);
}

TEST_CASE("judge: ratio bar, warning-only bars, absolute pass, NaN and Inf") {
  const Bar bar{1e-3, false, false, "test bar"};
  CHECK(judge(metrics_with_ratio(0.9e-3), bar) == Verdict::pass);
  CHECK(judge(metrics_with_ratio(1.1e-3), bar) == Verdict::fail);
  const Bar warn{1e-3, true, false, "warning only"};
  CHECK(judge(metrics_with_ratio(1.1e-3), warn) == Verdict::warn);
  // a nearly-zero tensor: large ratio, tiny absolute error
  const Metrics tiny = metrics_with_ratio(0.5, 1e-7);
  CHECK(tiny.max_abs <= tol::kFlaAbsPass);
  CHECK(judge(tiny, Bar{1e-3, false, true, "abs pass"}) == Verdict::pass);
  CHECK(judge(tiny, bar) == Verdict::fail);
  Tensor<double> a({4}, 1.0), b({4}, 1.0);
  a.data()[2] = NAN;
  CHECK(judge(compare(a.view(), b.view()), Bar{1, false, true, ""}) == Verdict::fail);
  a.data()[2] = INFINITY;
  CHECK(judge(compare(a.view(), b.view()), Bar{1, false, true, ""}) == Verdict::fail);
  b.data()[2] = INFINITY;  // the same Inf on both sides is agreement
  CHECK(judge(compare(a.view(), b.view()), bar) == Verdict::pass);
  b.data()[2] = -INFINITY;
  CHECK(judge(compare(a.view(), b.view()), Bar{1, false, true, ""}) == Verdict::fail);
}

TEST_CASE("compare measures and first_mismatches on a hand-computable pair") {
  // b = 1 everywhere in [2,3,4]; a differs by +0.5 at (0,1,2) and by -0.25 at (1,2,3)
  Tensor<double> b({2, 3, 4}, 1.0), a({2, 3, 4}, 1.0);
  a(0, 1, 2) += 0.5;
  a(1, 2, 3) -= 0.25;
  const Metrics m = compare(a.view(), b.view());
  CHECK(m.max_abs == 0.5);
  CHECK(m.max_abs_at == Shape{0, 1, 2});
  CHECK(m.a_at == 1.5);
  const double diff_rms = std::sqrt((0.25 + 0.0625) / 24.0);
  CHECK(m.fla_ratio == doctest::Approx(diff_rms / (1.0 + 1e-8)));
  CHECK(m.rel_l2 == doctest::Approx(std::sqrt(0.3125 / 24.0)));
  const auto mm = first_mismatches(a.view(), b.view(), 0.1, 5);
  REQUIRE(mm.size() == 2);
  CHECK(mm[0].at == Shape{0, 1, 2});
  CHECK(mm[1].at == Shape{1, 2, 3});
  CHECK(mm[1].a == 0.75);
  CHECK(first_mismatches(a.view(), b.view(), 0.3, 5).size() == 1);
  CHECK(first_mismatches(a.view(), b.view(), 0.1, 1).size() == 1);
}

TEST_CASE("compare: a float32 result whose every nonzero value is a bfloat16 number is flagged") {
  // 32 values: bf16 numbers (k/64 for small k is exact in bf16) against a float32 reference.
  Tensor<double> a({32}), b({32});
  for (int i = 0; i < 32; ++i) a.data()[i] = (i - 16) / 64.0, b.data()[i] = (i - 16) / 64.0 + 1e-6;
  Metrics m = compare(a.view(), b.view());
  CHECK(m.a_nonzero == 31);
  CHECK(m.a_bf16_exact == 31);
  CHECK(m.rounded_to_bf16());
  a.data()[5] = 0.1;  // 0.1 is not a bf16 number
  m = compare(a.view(), b.view());
  CHECK(m.a_bf16_exact == 30);
  CHECK_FALSE(m.rounded_to_bf16());
  Tensor<double> few({8}, 0.5), ref({8}, 0.5);  // too few values to tell
  CHECK_FALSE(compare(few.view(), ref.view()).rounded_to_bf16());
}
