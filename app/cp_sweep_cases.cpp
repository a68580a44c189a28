// The cp-sweep layouts and flag sets (see sweep_cases.h).
#include "app/cp_sweep_cases.h"

#include <numeric>
#include <sstream>

#include "cp/context.h"

namespace kcp::app {
using namespace kcp::cp;
namespace {

// Repeats `pattern` until the lengths sum to `total`, shortening the last one to fit.
std::vector<int64_t> fill(const std::vector<int64_t>& pattern, int64_t total) {
  std::vector<int64_t> out;
  for (int64_t sum = 0, i = 0; sum < total; ++i) {
    const int64_t len = std::min(pattern[size_t(i) % pattern.size()], total - sum);
    out.push_back(len);
    sum += len;
  }
  return out;
}

// Parts [u+7, 1, 0] for the first ranks (at most P-1 of them), the rest split equally.
std::vector<int64_t> uneven_bounds(int P, int64_t u, int64_t total) {
  const std::vector<int64_t> head = {u + 7, 1, 0};
  std::vector<int64_t> b = {0};
  const int fixed = std::min(P - 1, int(head.size()));
  for (int r = 0; r < fixed; ++r) b.push_back(b.back() + head[size_t(r)]);
  const std::vector<int64_t> rest = equal_bounds(total - b.back(), P - fixed);
  const int64_t base = b.back();
  for (size_t i = 1; i < rest.size(); ++i) b.push_back(base + rest[i]);
  return b;
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ":" : "") << v[i];
  return os.str();
}

}  // namespace

std::string SweepLayout::describe() const {
  return name + "(lens=" + join(seqlens) + (bounds.empty() ? "" : ",bounds=" + join(bounds)) + ")";
}

std::vector<SweepLayout> sweep_layouts(int P, int64_t u) {
  const int64_t T = P * u;
  std::vector<SweepLayout> out;
  out.push_back({"one-seq", {T}, {}});
  std::vector<int64_t> shorts = fill({0, 5, 1, 0, 9, 3, 12, 2, 7, 1, 4, 6, 1, 1, 8}, T);
  shorts.push_back(0);
  out.push_back({"many-short", shorts, {}});
  {
    const int64_t a = u / 2, b = std::min(2 * u + 1, T - a), rest = T - a - b;
    std::vector<int64_t> lens = {a, b};
    if (rest > 0) lens.insert(lens.end(), {rest / 2, rest - rest / 2});
    out.push_back({"span-3", lens, {}});
  }
  out.push_back({"rank-edges", fill({u, 2 * u}, T), {}});
  std::vector<int64_t> len1;
  for (int r = 0; r < P; ++r) len1.insert(len1.end(), {1, u - 2, 1});
  out.push_back({"len1-edges", len1, {}});
  out.push_back({"one-token-over", fill({u + 1, u - 1}, T), {}});
  {
    const int64_t Tu = T + 3;
    std::vector<int64_t> pattern = {u + 5, 4};
    for (int64_t sum = u + 9; sum < Tu; sum += u + 1) pattern.insert(pattern.end(), {u - 2, 3});
    out.push_back({"uneven", fill(pattern, Tu), uneven_bounds(P, u, Tu)});
  }
  out.push_back({"tiny", {2, 1}, {}});
  return out;
}

std::vector<SweepFlags> sweep_flag_sets(Variant v) {
  std::vector<SweepFlags> out;
  out.push_back({"plain", {}, true, true});
  Flags fused;
  fused.use_qk_l2norm_in_kernel = true;
  fused.use_gate_in_kernel = true;
  fused.use_beta_sigmoid_in_kernel = v != Variant::gla;
  out.push_back({"fused", fused, true, true});
  Flags third;
  third.state_v_first = true;
  third.use_gate_in_kernel = true;
  if (v == Variant::gdn) {  // negative eigenvalues, softplus gate without dt_bias
    third.use_beta_sigmoid_in_kernel = third.allow_neg_eigval = true;
    out.push_back({"neg-eigval,v-first", third, true, false});
  } else {  // the lower-bound gate (kda: with safe_gate; gla: without A_log)
    third.lower_bound = -3.0;
    third.safe_gate = v == Variant::kda;
    out.push_back({"lower-bound,v-first", third, v == Variant::kda, true});
  }
  return out;
}

}  // namespace kcp::app
