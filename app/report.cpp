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

void report_header() {
  std::printf("  %-13s %-14s %-4s %9s %-18s %9s %9s %12s %5s %-7s %9s  %s\n", "group", "tensor", "dt", "max_abs",
              "at (b,t,h,i,j)", "fla_ratio", "rel_l2", "cosine", "ulp", "nonfin", "bar", "verdict");
}

Verdict report_tensor(const std::string& group, const std::string& tensor, const TensorView& a,
                      const TensorView& b, DType stored, const Bar& bar, Tally& tally) {
  const Metrics m = compare(a, b);
  const Verdict v = judge(m, bar);
  tally.add(v);
  std::printf("  %-13s %-14s %-4s %9.2e %-18s %9.2e %9.2e %12.9f %5.0f %-7s %9.1e  %s\n", group.c_str(),
              tensor.c_str(), short_dtype(stored).c_str(), m.max_abs, index_str(m.max_abs_at).c_str(), m.fla_ratio,
              m.rel_l2, m.cosine, m.max_bf16_ulp, nonfinite_str(m).c_str(), bar.ratio,
              std::string(verdict_name(v)).c_str());
  if (v == Verdict::pass) return v;
  std::printf("      bar: fla_ratio <= %.1e (%s)%s\n", bar.ratio, bar.reason, bar.warn_only ? ", warning only" : "");
  // An element whose error alone exceeds the allowed rms error is a mismatch worth showing.
  const double threshold = bar.ratio * m.ref_rms;
  for (const Mismatch& mm : first_mismatches(a, b, threshold, kShownMismatches))
    std::printf("      at %-18s %s % .9e  oracle % .9e  diff % .3e\n", index_str(mm.at).c_str(), group.c_str(), mm.a,
                mm.b, mm.a - mm.b);
  return v;
}

void report_skip(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally) {
  tally.add(Verdict::skip);
  std::printf("  %-13s %-14s SKIP  %s\n", group.c_str(), tensor.c_str(), why.c_str());
}

void report_fail(const std::string& group, const std::string& tensor, const std::string& why, Tally& tally) {
  tally.add(Verdict::fail);
  std::printf("  %-13s %-14s FAIL  %s\n", group.c_str(), tensor.c_str(), why.c_str());
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
