// Table rows of kcp check / compare (see report.h).
#include "app/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "validation/compare.h"

namespace kcp::app {
using namespace kcp::val;
namespace {

constexpr int kShownMismatches = 5;

std::string nonfinite_str(const Metrics& m) {
  if (m.nan_a + m.nan_b + m.inf_a + m.inf_b == 0) return "-";
  std::ostringstream os;
  os << "nan " << m.nan_a << "/" << m.nan_b << " inf " << m.inf_a << "/" << m.inf_b;
  return os.str();
}

std::string short_dtype(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    default: return std::string(dtype_name(t));
  }
}

}  // namespace

void Tally::add(Verdict v) {
  switch (v) {
    case Verdict::pass: ++pass; break;
    case Verdict::warn: ++warn; break;
    case Verdict::fail: ++fail; break;
    case Verdict::skip: ++skip; break;
  }
}

void Tally::add(const Tally& t) { pass += t.pass, warn += t.warn, fail += t.fail, skip += t.skip; }

std::string Tally::summary() const {
  std::ostringstream os;
  os << pass << " pass, " << warn << " warn, " << fail << " fail, " << skip << " skip";
  return os.str();
}

std::string UserBar::describe() const {
  std::ostringstream os;
  if (ratio) os << "--ratio " << *ratio << " (FLA assert_close: max|d| <= 1e-6 or rms(d)/rms(ref) <= ratio)";
  if (ratio && rtol) os << ", ";
  if (rtol) os << "--rtol " << *rtol << " --atol " << *atol << " (torch.testing.assert_close: |d| <= atol + rtol*|ref|)";
  return os.str();
}

// Wide enough for the longest tensor name kcp prints (debug cp_transition_bwd.dS, 20 characters).
constexpr int kTensorColumn = 20;

void report_header(const UserBar& user) {
  if (user.any()) std::printf("  user bar: %s\n", user.describe().c_str());
  std::printf("  %-13s %-*s %-4s %9s %-18s %9s %9s %12s %5s %-7s %9s %-20s %s\n", "group", kTensorColumn, "tensor",
              "dt", "max_abs", "at (b,t,h,i,j)", "fla_ratio", "rel_l2", "cosine", "ulp", "nonfin", "bar",
              "over the bar", "verdict");
}

namespace {

// Elements of a outside the bar: not close under rtol/atol (NaN is never close, an Inf only to the
// same Inf), or, with a ratio bar only, |a-b| > ratio * rms(b).
int64_t count_over(const TensorView& av, const TensorView& bv, const UserBar& user, double ratio_threshold) {
  const Tensor<double> a = to_tensor<double>(av), b = to_tensor<double>(bv);
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data()[i], y = b.data()[i];
    if (std::isnan(x) || std::isnan(y)) { ++n; continue; }
    if (std::isinf(x) || std::isinf(y)) { n += x != y; continue; }
    const double d = std::abs(x - y);
    n += user.rtol ? d > *user.atol + *user.rtol * std::abs(y) : d > ratio_threshold;
  }
  return n;
}

Row note_row(const std::string& group, const std::string& tensor, const std::string& verdict, const std::string& note) {
  Row r;
  r.group = group, r.tensor = tensor, r.verdict = verdict, r.note = note;
  return r;
}

std::string over_str(int64_t over, int64_t n) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld/%lld (%.2g%%)", static_cast<long long>(over), static_cast<long long>(n),
                n ? 100.0 * double(over) / double(n) : 0.0);
  return buf;
}

}  // namespace

Verdict report_tensor(const std::string& group, const std::string& tensor, const TensorView& a,
                      const TensorView& b, DType stored, const Bar& policy, Tally& tally) {
  const UserBar& user = tally.user;
  const Metrics m = compare(a, b);
  Bar bar = policy;
  if (user.ratio)
    bar = {*user.ratio, false, true, "--ratio (FLA assert_close: pass when max|d| <= 1e-6 or the ratio is within)"};
  Verdict v = Verdict::pass;
  if (!user.rtol || user.ratio) v = judge(m, bar);
  const double ratio_threshold = bar.ratio * m.ref_rms;
  const int64_t over = count_over(a, b, user, ratio_threshold);
  if (user.rtol && (over > 0 || !m.finite_ok())) v = Verdict::fail;
  const bool ratio_shown = !user.rtol || user.ratio;
  tally.add(v);
  char bar_col[16] = "close";
  if (ratio_shown) std::snprintf(bar_col, sizeof bar_col, "%9.1e", bar.ratio);
  std::printf("  %-13s %-*s %-4s %9.2e %-18s %9.2e %9.2e %12.9f %5.0f %-7s %9s %-20s %s\n", group.c_str(),
              kTensorColumn, tensor.c_str(), short_dtype(stored).c_str(), m.max_abs, index_str(m.max_abs_at).c_str(),
              m.fla_ratio, m.rel_l2, m.cosine, m.max_bf16_ulp, nonfinite_str(m).c_str(), bar_col,
              over_str(over, m.n).c_str(), std::string(verdict_name(v)).c_str());
  Row row = note_row(group, tensor, std::string(verdict_name(v)), "");
  row.measured = true, row.dtype = short_dtype(stored), row.m = m, row.over = over;
  row.ratio_bar = ratio_shown ? bar.ratio : 0.0;
  row.bar_reason = user.any() ? user.describe() : bar.reason;
  tally.rows.push_back(row);
  if (v == Verdict::pass) return v;
  if (user.any()) std::printf("      bar: %s\n", user.describe().c_str());
  else std::printf("      bar: fla_ratio <= %.1e (%s)%s\n", bar.ratio, bar.reason, bar.warn_only ? ", warning only" : "");
  if ((stored == DType::f32 || stored == DType::f64) && m.rounded_to_bf16())
    std::printf("      note: all %lld nonzero values of %s are bfloat16 numbers although it is stored as %s: the "
                "kernel rounded it through bf16 (about 2^-9 relative per value)\n",
                static_cast<long long>(m.a_nonzero), tensor.c_str(), std::string(dtype_name(stored)).c_str());
  // An element outside the bar is a mismatch worth showing.
  const double threshold = user.rtol ? *user.atol : ratio_threshold;
  for (const Mismatch& mm : first_mismatches(a, b, threshold, kShownMismatches)) {
    if (user.rtol && std::isfinite(mm.a) && std::abs(mm.a - mm.b) <= *user.atol + *user.rtol * std::abs(mm.b)) continue;
    std::printf("      at %-18s %s % .9e  oracle % .9e  diff % .3e\n", index_str(mm.at).c_str(), group.c_str(), mm.a,
                mm.b, mm.a - mm.b);
  }
  return v;
}

void report_skip(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally) {
  tally.add(Verdict::skip);
  tally.rows.push_back(note_row(group, tensor, "SKIP", why));
  std::printf("  %-13s %-*s SKIP  %s\n", group.c_str(), kTensorColumn, tensor.c_str(), why.c_str());
}

void report_fail(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally) {
  tally.add(Verdict::fail);
  tally.rows.push_back(note_row(group, tensor, "FAIL", why));
  std::printf("  %-13s %-*s FAIL  %s\n", group.c_str(), kTensorColumn, tensor.c_str(), why.c_str());
}

std::vector<std::string> expand_dump_paths(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const std::string& a : args) {
    std::error_code ec;
    if (fs::is_directory(a, ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(a, ec)) {
        const std::string name = e.path().filename().string();
        if (name.find(".h5.tmp-") != std::string::npos)  // io/dump.cpp's temporary name: a killed run's leftover
          std::fprintf(stderr, "kcp: note: ignoring %s (the temporary file of a kcp run that was killed; remove it)\n",
                       e.path().string().c_str());
        else if (e.is_regular_file() && e.path().extension() == ".h5") files.push_back(e.path().string());
      }
      KCP_CHECK(!files.empty(), a, ": no .h5 files in this folder");
      std::sort(files.begin(), files.end());
      out.insert(out.end(), files.begin(), files.end());
    } else {
      KCP_CHECK(fs::exists(fs::symlink_status(a, ec)), a, ": no such file or folder");  // the reader explains the rest
      out.push_back(a);
    }
  }
  return out;
}

DType parse_precision(const std::string& s) {
  if (s == "f64" || s == "float64") return DType::f64;
  if (s == "f32" || s == "float32") return DType::f32;
  throw Error("--precision: expected f64 or f32, got '" + s + "'");
}

}  // namespace kcp::app

namespace kcp::app {

bool Selection::matches(const std::string& group, const std::string& tensor) const {
  if (items.empty()) return true;
  for (const std::string& s : items)
    if (s == group || s == tensor || s == group + "/" + tensor) return true;
  return false;
}

Selection parse_selection(const std::string& s) {
  Selection sel;
  std::string item;
  std::istringstream is(s);
  while (std::getline(is, item, ','))
    if (!item.empty()) sel.items.push_back(item);
  KCP_CHECK(s.empty() || !sel.items.empty(), "--select: expected a comma-separated list of groups or tensors, got '",
            s, "'");
  return sel;
}

}  // namespace kcp::app
