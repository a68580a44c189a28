// The CP context of one rank (ALGORITHMS.md 5.1, with the uneven partitions of 5.7): the packed token
// stream [0, T) with global cu_seqlens [N+1] is cut into contiguous parts by bounds R[0..P]
// (R[0] = 0, nondecreasing, R[P] = T); rank r owns tokens [R[r], R[r+1]). The default partition
// is FLA's equal one (R[r] = r*T/P), spreading T % P extra tokens over the first ranks when P does
// not divide T (FLA requires that it does).
//   local sequences: the global ids [seq_begin, seq_end) whose tokens meet [lo, hi), plus the
//     zero-length sequences this rank owns (position t < T: the rank holding token t; t = T: the
//     last rank with tokens), so every sequence has one rank that writes its final state
//   local_cu: their clamped ranges minus lo (FLA's local cu_seqlens, zero-length entries kept)
//   pre_num_ranks = r - rank_of(first_start), post_num_ranks = rank_of(last_end - 1) - r
//   is_first_rank / is_last_rank: the first local sequence starts here / the last one ends here
//   pre_num_conv_tokens = lo - first_start: tokens of the first local sequence on earlier ranks
// A rank with no tokens has no local sequences, both flags set and contributes the identity.
// Covered by tests/cp/test_cp_context.cpp (hand-worked partitions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kcp::cp {

struct CpContext {
  int rank = 0, size = 1;              // this rank, P
  std::vector<int64_t> bounds;         // [P+1] part boundaries R
  int64_t lo = 0, hi = 0;              // this rank's global tokens [lo, hi)
  int64_t seq_begin = 0, seq_end = 0;  // global ids of the local sequences
  std::vector<int64_t> local_cu;       // [N_local+1], 0 .. hi-lo
  int64_t pre_num_ranks = 0, post_num_ranks = 0;
  bool is_first_rank = true, is_last_rank = true;
  int64_t pre_num_conv_tokens = 0;

  int64_t tokens() const { return hi - lo; }
  bool empty() const { return hi == lo; }
  int64_t n_local() const { return seq_end - seq_begin; }
  int64_t total() const { return bounds.back(); }
  // Local sequence i (0-based) starts / ends on this rank.
  bool starts_here(int64_t i) const { return i > 0 || is_first_rank; }
  bool ends_here(int64_t i) const { return i < n_local() - 1 || is_last_rank; }
  std::string describe() const;  // "rank 2/4 [5120,7680) seqs [0,2) local_cu [0,1880,2560] pre 2 post 1 conv 5120"
};

// FLA's equal contiguous parts: part = T/P tokens each, the first T % P ranks one more.
std::vector<int64_t> equal_bounds(int64_t total, int P);

// The rank whose part holds token t (0 <= t < T); parts of empty ranks hold nothing.
int rank_of_token(const std::vector<int64_t>& bounds, int64_t t);

// Validates cu_seqlens and bounds (clear kcp::Error on any mismatch) and derives rank `rank`'s fields.
CpContext build_cp_context(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& bounds, int rank);

}  // namespace kcp::cp
