// The table `kcp check` and `kcp compare` print: one row per (group, tensor) with the measures of
// compare(), the count of elements over the bar, and the verdict, then, under a failing or warning
// row, the bar's reason and the first mismatching elements. Every row is also kept (Tally::rows) for
// --json and --plot. User bars (UserBar) replace the policy's bar:
//   --ratio R      FLA's assert_close: pass when max|a-b| <= 1e-6, else when rms(a-b)/(rms(b)+1e-8) <= R
//   --rtol/--atol  torch.testing.assert_close: every element |a-b| <= atol + rtol*|b| (NaN never close)
// With both, a tensor must meet both. "over" counts the elements outside the bar: for rtol/atol the
// elements that are not close (torch's "Mismatched elements"); for a ratio bar the elements whose
// error alone exceeds the allowed rms error, |a-b| > R * rms(b).
// Also the shared helpers of the dump commands (paths, precision, --select).
// Covered by tests/validation/test_cli.cpp (through the kcp executable).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "validation/policy.h"

namespace kcp::app {

using val::Bar;
using val::Verdict;

struct UserBar {
  std::optional<double> ratio, rtol, atol;
  bool any() const { return ratio || rtol; }
  std::string describe() const;  // "--ratio 0.005 (FLA assert_close), --rtol 0.001 --atol 1e-05 (torch ...)"
};

// One judged (or skipped) tensor.
struct Row {
  std::string group, tensor, verdict, note;  // note: why skipped / failed without measures
  bool measured = false;
  std::string dtype;
  val::Metrics m;
  double ratio_bar = 0;  // 0 when no ratio bar applies (rtol/atol only)
  std::string bar_reason;
  int64_t over = 0;
};

struct Tally {
  int64_t pass = 0, warn = 0, fail = 0, skip = 0;
  UserBar user;           // the bars of this run (empty: the policy's)
  std::vector<Row> rows;  // every row printed, in order
  void add(Verdict v);
  void add(const Tally& t);  // counts only
  int64_t judged() const { return pass + warn + fail; }
  std::string summary() const;  // "12 pass, 1 warn, 0 fail, 2 skip"
};

void report_header(const UserBar& user = {});
// Compares candidate a with reference b under `bar` (or the user's bars), prints the row (and details
// when it does not pass), and counts the verdict.
Verdict report_tensor(const std::string& group, const std::string& tensor, const TensorView& a,
                      const TensorView& b, DType stored, const Bar& bar, Tally& tally);
void report_skip(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally);
void report_fail(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally);

// kcp check / compare arguments: folders expand to their *.h5 files (sorted); "f64" | "f32".
std::vector<std::string> expand_dump_paths(const std::vector<std::string>& args);
DType parse_precision(const std::string& s);

// --select "o,fla_chunk/dq,megatron": an entry matches a group, a tensor, or "group/tensor".
struct Selection {
  std::vector<std::string> items;
  bool all() const { return items.empty(); }
  bool matches(const std::string& group, const std::string& tensor) const;
};
Selection parse_selection(const std::string& s);

}  // namespace kcp::app
