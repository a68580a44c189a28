// The intra-card CP planner (docs/CP.md "Intra-card CP", ALGORITHMS.md 5.8): whether and how to cut
// the sequences of one forward call into chunk-aligned segments that run in parallel from merged
// initial states. Only long sequences are cut; every cut lies on a multiple of the chunk size C from
// the sequence's start, so the chunk grid (and with it every chunk computation) is the unsplit one.
//   automatic: a cost model in state-stage chunk steps (one block of the state stage advancing one
//              chunk over BV state columns), per phase max(longest chain, work / slots), slots =
//              multiprocessors x blocks_per_sm:
//                unsplit  F(1)    = max(longest sequence, sum_n chunks_n HV ceil(V/BV) / slots)
//                split    F(L) + transition (the segments whose state is needed: V+K columns, x
//                         transition_cost) + scan (segments per sequence x scan_cost) + fixed_cost
//              over segment lengths L = C x min_segment_chunks x 2^i; the cheapest L wins when it
//              beats unsplit by min_gain; otherwise nothing is split.
//   forced:    every sequence longer than forced_tokens (rounded up to a multiple of C) is cut into
//              segments of that length, the last one shorter: the test control (KCP_CUDA_SEGMENT).
//   off:       never split.
// Covered by tests/segment/test_plan.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.h"

namespace kcp::seg {

enum class SegmentMode { automatic, off, forced };

struct SegmentOptions {
  SegmentMode mode = SegmentMode::automatic;
  int64_t forced_tokens = 0;  // forced: the segment length in tokens (rounded up to a multiple of C)
  // The automatic model. Uncalibrated first guesses (2026-11-25, no GPU measurement yet); every
  // constant is in units of one forward chunk step of one block. Calibrate them from `kcp bench
  // --explain` runs with forced segment lengths (docs/CP.md).
  int64_t value_tile = 32;         // BV: state columns one block of the state stage owns
  int blocks_per_sm = 1;           // blocks of the state stage resident on one multiprocessor
  int64_t min_segment_chunks = 8;  // no segment shorter than this: it would not pay its transition
  double transition_cost = 2.0;    // one chunk step of the transition, per BV columns of [S | M]: the
                                   // front stages again and M's products split 3xTF32
  double scan_cost = 1.0;          // one step of the scan (a K x K by K x 32 product per block)
  double fixed_cost = 16.0;        // the extra launches and copies of a split call
  double min_gain = 0.15;          // split only when the estimate is this fraction below unsplit
};

// "auto" (or empty), "off" (or "0"), or a positive token count (forced). Throws naming `what`.
SegmentOptions parse_segment_option(std::string_view text, std::string_view what = "segment");
// The options from an environment variable (unset: automatic), e.g. KCP_CUDA_SEGMENT.
SegmentOptions segment_options_from_env(const char* variable);

struct SegmentPlan {
  bool split = false;
  int64_t segment_tokens = 0;     // the cut length (a multiple of C); 0 when unsplit
  std::vector<int64_t> cu;        // segment boundaries over the B*T tokens [Nseg+1] (split only)
  std::vector<int64_t> seq_seg;   // [N+1]: sequence n holds segments [seq_seg[n], seq_seg[n+1])
  int64_t split_sequences = 0;    // sequences cut into more than one segment
  int64_t longest_split = 0;      // most segments of one sequence
  // The one batched transition: segments [transition_first, transition_first + transition_count)
  // (from the first cut sequence's first segment to the last cut sequence's last-but-one).
  int64_t transition_first = 0, transition_count = 0;
  double est_unsplit = 0, est_split = 0;  // the model's costs (chunk steps); est_split 0 when none tried
  std::string reason;                     // why split or not, one line

  int64_t segments() const { return split ? int64_t(cu.size()) - 1 : 0; }
  std::string describe() const;           // one line for `kcp bench --explain`
};

SegmentPlan plan_segments(const Problem& p, int multiprocessors, const SegmentOptions& opt);

}  // namespace kcp::seg
