// The cp-sweep matrix: token layouts (sequence lengths and part boundaries, built for the rank count
// P at run time) and flag sets per variant. u is the tokens-per-rank unit (chunk size 16 plus an odd
// remainder, so rank cuts are not chunk-aligned and sequences span several chunks).
//   one-seq         one sequence across all ranks
//   many-short      short sequences (lengths 0..12, zero-length ones at both ends) cut anywhere
//   span-3          a sequence spanning more than two ranks between shorter ones
//   rank-edges      every sequence boundary exactly on a rank edge (lengths u, 2u, u, ...)
//   len1-edges      length-1 sequences as the first and last token of every rank
//   one-token-over  sequences that reach one token into the next rank
//   uneven          explicit parts [u+7, 1, 0, rest...]: T % P != 0, a one-token rank, an empty
//                   rank, a sequence running through both
//   tiny            T = 3 tokens (more ranks than tokens at P = 4)
// Covered by running it: tests/cp/CMakeLists.txt (cp-sweep at 1-4 ranks).
#pragma once

#include <string>
#include <vector>

#include "core/problem.h"

namespace kcp::app {

struct SweepLayout {
  std::string name;
  std::vector<int64_t> seqlens;
  std::vector<int64_t> bounds;  // empty: equal parts
  std::string describe() const;  // "uneven(lens=28:4:...,bounds=0:28:29:29:74)"
};

struct SweepFlags {
  std::string name;
  Flags flags;
  bool A_log = true, dt_bias = true;  // with the fused gate
};

std::vector<SweepLayout> sweep_layouts(int P, int64_t unit);
std::vector<SweepFlags> sweep_flag_sets(Variant v);

}  // namespace kcp::app
