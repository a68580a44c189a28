// The table `kcp check` and `kcp compare` print: one row per (group, tensor) with the measures of
// compare() and the verdict of the policy, then, under a failing or warning row, the bar's reason
// and the first mismatching elements. Also the shared helpers of the dump commands (paths, precision).
// Covered by tests/validation/test_cli.cpp (through the kcp executable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "validation/policy.h"

namespace kcp::app {

using val::Bar;
using val::Verdict;

struct Tally {
  int64_t pass = 0, warn = 0, fail = 0, skip = 0;
  void add(Verdict v);
  void add(const Tally& t);
  std::string summary() const;  // "12 pass, 1 warn, 0 fail, 2 skip"
};

void report_header();
// Compares candidate a with reference b under `bar`, prints the row (and details when it does not
// pass), and counts the verdict.
Verdict report_tensor(const std::string& group, const std::string& tensor, const TensorView& a,
                      const TensorView& b, DType stored, const Bar& bar, Tally& tally);
void report_skip(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally);
void report_fail(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally);

// kcp check / compare arguments: folders expand to their *.h5 files (sorted); "f64" | "f32".
std::vector<std::string> expand_dump_paths(const std::vector<std::string>& args);
DType parse_precision(const std::string& s);

}  // namespace kcp::app
