// The intra-card CP planner (segment/plan.h): forced cuts (lengths 0, 1, C, C+1, 2C, odd long; the
// length rounded up to a multiple of C), the batched transition range (first cut sequence's first
// segment to the last cut sequence's last-but-one), dense batches, the automatic model (never on a
// host queue's single unit, never when the sequences already fill the slots, only when it pays by
// min_gain), balanced cuts on chunk boundaries, and the option parser.
#include <doctest/doctest.h>

#include <cstdlib>
#include <numeric>

#include "core/problem.h"
#include "segment/plan.h"

using namespace kcp;
using namespace kcp::seg;

namespace {

// A problem with only the sizes the planner reads (no tensors needed).
Problem sizes(std::vector<int64_t> lens, int64_t HV = 2, int64_t K = 64, int64_t V = 64, int64_t C = 64, int64_t B = 1,
              int64_t T = 0) {
  Problem p;
  p.variant = Variant::gdn;
  p.H = 1, p.HV = HV, p.K = K, p.V = V, p.chunk_size = C;
  if (lens.empty()) {
    p.B = B, p.T = T, p.N = B;
  } else {
    p.B = 1, p.N = int64_t(lens.size());
    p.cu_seqlens = {0};
    for (int64_t l : lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + l);
    p.T = p.cu_seqlens.back();
  }
  return p;
}

SegmentOptions forced(int64_t tokens) {
  SegmentOptions o;
  o.mode = SegmentMode::forced, o.forced_tokens = tokens;
  return o;
}

// Every segment lies inside one sequence, starts on a multiple of C from that sequence's start, and
// the segments of each sequence tile it exactly.
void check_tiling(const Problem& p, const SegmentPlan& pl) {
  REQUIRE(pl.seq_seg.size() == size_t(p.N) + 1);
  REQUIRE(pl.cu.front() == 0);
  REQUIRE(pl.cu.back() == p.B * p.T);
  for (int64_t n = 0; n < p.N; ++n) {
    const SeqRange r = p.sequence(n);
    const int64_t start = r.b * p.T + r.t0, s0 = pl.seq_seg[size_t(n)], s1 = pl.seq_seg[size_t(n) + 1];
    REQUIRE(s1 > s0);
    CHECK(pl.cu[size_t(s0)] == start);
    CHECK(pl.cu[size_t(s1)] == start + r.len);
    for (int64_t s = s0; s < s1; ++s) {
      CHECK((pl.cu[size_t(s)] - start) % p.chunk_size == 0);
      if (s + 1 < s1) CHECK(pl.cu[size_t(s) + 1] - pl.cu[size_t(s)] > 0);
    }
  }
}

}  // namespace

TEST_CASE("forced segments: only sequences longer than the length are cut, on chunk boundaries") {
  const int64_t C = 16;
  const Problem p = sizes({0, 1, C, C + 1, 2 * C, 5 * C + 3, 7}, 2, 8, 8, C);
  const SegmentPlan pl = plan_segments(p, 1, forced(C));
  REQUIRE(pl.split);
  check_tiling(p, pl);
  // segments per sequence: 1, 1, 1, 2 (C + 1), 2 (C + C), 6 (5C + 3), 1
  CHECK(pl.seq_seg == std::vector<int64_t>{0, 1, 2, 3, 5, 7, 13, 14});
  CHECK(pl.split_sequences == 3);
  CHECK(pl.longest_split == 6);
  CHECK(pl.segments() == 14);
  // the one transition call: from the first cut sequence's first segment (3) to the last one's
  // last-but-one (11)
  CHECK(pl.transition_first == 3);
  CHECK(pl.transition_count == 12 - 3);
  CHECK(pl.cu[4] - pl.cu[3] == C);  // C + 1 = C | 1
  CHECK(pl.cu[5] - pl.cu[4] == 1);
  CHECK(pl.cu[13] - pl.cu[12] == 3);  // 5C + 3: five pieces of C and the 3-token rest
  CHECK(!pl.describe().empty());
}

TEST_CASE("forced length is rounded up to a multiple of C; nothing longer means no split") {
  const Problem p = sizes({300, 64}, 2, 8, 8, 64);
  SegmentPlan pl = plan_segments(p, 1, forced(100));
  REQUIRE(pl.split);
  CHECK(pl.segment_tokens == 128);
  CHECK(pl.seq_seg == std::vector<int64_t>{0, 3, 4});  // 300 = 128 + 128 + 44
  check_tiling(p, pl);
  pl = plan_segments(p, 1, forced(512));
  CHECK(!pl.split);
  CHECK(pl.reason.find("no sequence is longer") != std::string::npos);
}

TEST_CASE("forced segments of a dense batch: each row is a sequence over the B*T tokens") {
  const Problem p = sizes({}, 2, 8, 8, 16, /*B=*/3, /*T=*/40);
  const SegmentPlan pl = plan_segments(p, 1, forced(16));
  REQUIRE(pl.split);
  check_tiling(p, pl);
  CHECK(pl.cu == std::vector<int64_t>{0, 16, 32, 40, 56, 72, 80, 96, 112, 120});
  CHECK(pl.transition_first == 0);
  CHECK(pl.transition_count == 8);  // rows 0..2, all but the last row's last segment
}

TEST_CASE("automatic plan: never on one unit, never when the sequences fill the slots, only when it pays") {
  SegmentOptions o;  // automatic
  const Problem one_long = sizes({32768}, 16, 128, 128);
  CHECK(!plan_segments(one_long, 1, o).split);  // a host queue: one unit, nothing to fill
  o.blocks_per_sm = 4;  // a state kernel that leaves room on each multiprocessor
  const SegmentPlan pl = plan_segments(one_long, 132, o);
  REQUIRE(pl.split);
  check_tiling(one_long, pl);
  CHECK(pl.est_split < pl.est_unsplit * (1 - o.min_gain));
  CHECK(pl.segment_tokens % 64 == 0);
  CHECK(pl.segment_tokens >= o.min_segment_chunks * 64);
  // 16 x 2048 packed with 16 heads: 16 * 16 * 4 = 1024 blocks already fill 528 slots
  const SegmentPlan packed = plan_segments(sizes(std::vector<int64_t>(16, 2048), 16, 128, 128), 132, o);
  CHECK(!packed.split);
  // the same long sequence with a costly transition: the model says no
  o.transition_cost = 50;
  const SegmentPlan costly = plan_segments(one_long, 132, o);
  CHECK(!costly.split);
  CHECK(costly.reason.find("does not pay") != std::string::npos);
  // short sequences are never cut
  o = SegmentOptions{};
  o.blocks_per_sm = 4;
  CHECK(!plan_segments(sizes({300, 1, 64}, 1, 64, 64), 132, o).split);
  o.mode = SegmentMode::off;
  CHECK(!plan_segments(one_long, 132, o).split);
}

TEST_CASE("automatic plan: balanced cuts keep the chunk grid and split only the long sequences") {
  SegmentOptions o;
  o.blocks_per_sm = 8;
  const Problem p = sizes({100, 20000, 64, 9000, 1}, 4, 128, 128);
  const SegmentPlan pl = plan_segments(p, 132, o);
  REQUIRE(pl.split);
  check_tiling(p, pl);
  CHECK(pl.seq_seg[1] - pl.seq_seg[0] == 1);  // 100 tokens: never cut
  CHECK(pl.seq_seg[3] - pl.seq_seg[2] == 1);
  CHECK(pl.seq_seg[5] - pl.seq_seg[4] == 1);
  CHECK(pl.seq_seg[2] - pl.seq_seg[1] > 1);  // 20000 tokens: cut
}

TEST_CASE("segment options: auto, off, a token count; bad values are refused with the variable's name") {
  CHECK(parse_segment_option("").mode == SegmentMode::automatic);
  CHECK(parse_segment_option("auto").mode == SegmentMode::automatic);
  CHECK(parse_segment_option("off").mode == SegmentMode::off);
  CHECK(parse_segment_option("0").mode == SegmentMode::off);
  const SegmentOptions f = parse_segment_option("512");
  CHECK(f.mode == SegmentMode::forced);
  CHECK(f.forced_tokens == 512);
  CHECK_THROWS_WITH_AS(parse_segment_option("64k", "KCP_CUDA_SEGMENT"), doctest::Contains("KCP_CUDA_SEGMENT"), Error);
  CHECK_THROWS_AS(parse_segment_option("-5"), Error);
}

TEST_CASE("segment options from the environment: unset is automatic, a value is parsed") {
  ::unsetenv("KCP_TEST_SEGMENT");
  CHECK(segment_options_from_env("KCP_TEST_SEGMENT").mode == SegmentMode::automatic);
  ::setenv("KCP_TEST_SEGMENT", "256", 1);
  CHECK(segment_options_from_env("KCP_TEST_SEGMENT").forced_tokens == 256);
  ::setenv("KCP_TEST_SEGMENT", "off", 1);
  CHECK(segment_options_from_env("KCP_TEST_SEGMENT").mode == SegmentMode::off);
  ::unsetenv("KCP_TEST_SEGMENT");
}
