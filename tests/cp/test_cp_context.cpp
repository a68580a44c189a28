// CP context against hand-worked partitions (ALGORITHMS.md 5.1 example, uneven parts with an empty
// rank, zero-length sequences at the stream's ends) and the partition errors; no MPI needed.
#include <doctest/doctest.h>

#include "core/error.h"
#include "cp/context.h"

using namespace kcp;
using cp::CpContext;

namespace {

struct Want {
  int64_t lo, hi, seq_begin, seq_end;
  std::vector<int64_t> local_cu;
  int64_t pre, post;
  bool first, last;
  int64_t conv;
};

void check_context(const CpContext& c, const Want& w) {
  INFO(c.describe());
  CHECK(c.lo == w.lo);
  CHECK(c.hi == w.hi);
  CHECK(c.seq_begin == w.seq_begin);
  CHECK(c.seq_end == w.seq_end);
  CHECK(c.local_cu == w.local_cu);
  CHECK(c.pre_num_ranks == w.pre);
  CHECK(c.post_num_ranks == w.post);
  CHECK(c.is_first_rank == w.first);
  CHECK(c.is_last_rank == w.last);
  CHECK(c.pre_num_conv_tokens == w.conv);
}

}  // namespace

TEST_CASE("cp context: FLA's example, lengths [7000, 3240] on 4 ranks (part 2560)") {
  const std::vector<int64_t> cu = {0, 7000, 10240};
  const std::vector<int64_t> bounds = cp::equal_bounds(10240, 4);
  CHECK(bounds == std::vector<int64_t>{0, 2560, 5120, 7680, 10240});
  const Want want[] = {
      {0, 2560, 0, 1, {0, 2560}, 0, 2, true, false, 0},
      {2560, 5120, 0, 1, {0, 2560}, 1, 1, false, false, 2560},
      {5120, 7680, 0, 2, {0, 1880, 2560}, 2, 1, false, false, 5120},
      {7680, 10240, 1, 2, {0, 2560}, 1, 0, false, true, 680},
  };
  for (int r = 0; r < 4; ++r) check_context(cp::build_cp_context(cu, bounds, r), want[r]);
}

TEST_CASE("cp context: uneven parts [4, 0, 3, 6] with an empty rank and an empty sequence") {
  // sequences [0,5) [5,6) [6,6) [6,13); the empty one at token 6 belongs to the rank holding token 6
  const std::vector<int64_t> cu = {0, 5, 6, 6, 13}, bounds = {0, 4, 4, 7, 13};
  const Want want[] = {
      {0, 4, 0, 1, {0, 4}, 0, 2, true, false, 0},
      {4, 4, 0, 0, {0}, 0, 0, true, true, 0},
      {4, 7, 0, 4, {0, 1, 2, 2, 3}, 2, 1, false, false, 4},
      {7, 13, 3, 4, {0, 6}, 1, 0, false, true, 1},
  };
  for (int r = 0; r < 4; ++r) check_context(cp::build_cp_context(cu, bounds, r), want[r]);
  CHECK(cp::build_cp_context(cu, bounds, 1).empty());
}

TEST_CASE("cp context: zero-length sequences at token 0 and at the end, one-token parts") {
  const std::vector<int64_t> cu = {0, 0, 3, 3}, bounds = {0, 1, 2, 3};
  const Want want[] = {
      {0, 1, 0, 2, {0, 0, 1}, 0, 2, true, false, 0},
      {1, 2, 1, 2, {0, 1}, 1, 1, false, false, 1},
      {2, 3, 1, 3, {0, 1, 1}, 2, 0, false, true, 2},
  };
  for (int r = 0; r < 3; ++r) check_context(cp::build_cp_context(cu, bounds, r), want[r]);
}

TEST_CASE("cp context: equal parts when P does not divide T, and more ranks than tokens") {
  CHECK(cp::equal_bounds(10, 4) == std::vector<int64_t>{0, 3, 6, 8, 10});
  CHECK(cp::equal_bounds(3, 4) == std::vector<int64_t>{0, 1, 2, 3, 3});
  CHECK(cp::equal_bounds(8, 4) == std::vector<int64_t>{0, 2, 4, 6, 8});  // FLA's part = T/P
  const CpContext last = cp::build_cp_context({0, 2, 3}, cp::equal_bounds(3, 4), 3);
  CHECK(last.empty());
  CHECK(last.n_local() == 0);
  const CpContext r1 = cp::build_cp_context({0, 2, 3}, cp::equal_bounds(3, 4), 1);
  check_context(r1, {1, 2, 0, 1, {0, 1}, 1, 0, false, true, 1});
  CHECK(cp::rank_of_token({0, 1, 1, 1, 3}, 1) == 3);  // empty parts are skipped
}

TEST_CASE("cp context: bad partitions and cu_seqlens are rejected with the argument named") {
  using doctest::Contains;
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 5}, {0, 3, 6}, 0), Contains("cover 6 tokens but cu_seqlens ends at T = 5"),
                       Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 0}, {0, 0}, 0), Contains("token stream is empty"), Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 4, 3}, {0, 3}, 0), Contains("cu_seqlens: must be nondecreasing"), Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({1, 4}, {0, 4}, 0), Contains("cu_seqlens: must start at 0"), Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 4}, {0, 3, 2, 4}, 0), Contains("cp bounds: must be nondecreasing"), Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 4}, {1, 4}, 0), Contains("cp bounds: must start at 0"), Error);
  CHECK_THROWS_WITH_AS(cp::build_cp_context({0, 4}, {0, 2, 4}, 2), Contains("rank 2 outside [0, 2)"), Error);
}
