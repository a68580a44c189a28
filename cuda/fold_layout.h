// The block layouts of the folded gdn state kernel (chunk_state_fold.cu) and the automatic choice
// among them, host-only so that tests without a GPU check it (test_cuda_backend.cpp). A block owns
// 16 x groups x warpgroups state columns: `warpgroups` warpgroups (sharing the tiles a chunk loads:
// k, q, P, Aqk, gates), each of `groups` 16-column groups. Instantiated: 1 x 1, 2 x 1, 2 x 2.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace kcp::cuda {

struct FoldLayout {
  int groups = 0, warpgroups = 1;  // groups 0: automatic
};

inline bool fold_layout_valid(FoldLayout f) {
  return (f.warpgroups == 1 && f.groups >= 0 && f.groups <= 2) || (f.groups == 2 && f.warpgroups == 2);
}

// The layout with the fewest waves of blocks times one block's step time, for Vw state columns of
// `heads` (sequence, value head) chains on `sms` multiprocessors: a block walks its chain one chunk at
// a time, one block a multiprocessor. Step times measured on the H200 at K = 128 (docs/CUDA.md, "Block
// layouts"): 1 x 1 1.37 us, 2 x 1 1.99 (with their loader warpgroup, fifty-first session; 1.57 and 2.16
// before), 2 x 2 3.38 (fiftieth). A block of more columns takes longer a step: the step is bound by
// instruction issue and latency (ncu, docs/BENCHMARKS.md, fiftieth session), most of its instructions
// are per column, and the warpgroups of a block share one multiprocessor.
inline FoldLayout automatic_fold_layout(int64_t Vw, int64_t heads, int64_t sms) {
  struct Option {
    FoldLayout f;
    double step;
  };
  constexpr Option options[] = {{{1, 1}, 1.37}, {{2, 1}, 1.99}, {{2, 2}, 3.38}};
  FoldLayout best{1, 1};
  double best_cost = 0;
  for (const Option& o : options) {
    const int64_t cols = 16 * o.f.groups * o.f.warpgroups;
    if (Vw % cols != 0) continue;
    const int64_t blocks = Vw / cols * heads, waves = (blocks + sms - 1) / sms;
    const double cost = double(waves) * o.step;
    if (best_cost == 0 || cost < best_cost) best = o.f, best_cost = cost;
  }
  return best;
}

// The layout a launch runs: `requested` where given (groups > 0), else the automatic one; a layout whose
// block columns do not divide Vw falls back to 2 x 1 (V and V + K are multiples of 32).
inline FoldLayout resolve_fold_layout(FoldLayout requested, int64_t Vw, int64_t heads, int64_t sms) {
  FoldLayout f = requested.groups ? requested : automatic_fold_layout(Vw, heads, sms);
  if (Vw % (16 * f.groups * f.warpgroups) != 0) f = {2, 1};
  return f;
}

// A layout as the schedule's explanation names it: "1 warpgroup x 16 columns", "2 warpgroups x 32 columns".
inline std::string fold_layout_text(FoldLayout f) {
  return std::to_string(f.warpgroups) + (f.warpgroups == 1 ? " warpgroup x " : " warpgroups x ") +
         std::to_string(16 * f.groups) + " columns";
}

// KCP_CUDA_STATE_GROUPS's value: null, "" or "auto" the automatic layout; "1", "2" (16-column groups
// of one warpgroup) or "2x2"; anything else is an error naming the variable, not a silent default.
inline FoldLayout parse_fold_layout(const char* text) {
  const std::string t = text ? text : "";
  if (t.empty() || t == "auto") return {};
  if (t == "1") return {1, 1};
  if (t == "2") return {2, 1};
  KCP_CHECK(t == "2x2", "KCP_CUDA_STATE_GROUPS=", t, ": expected auto, 1, 2 or 2x2");
  return {2, 2};
}

}  // namespace kcp::cuda
