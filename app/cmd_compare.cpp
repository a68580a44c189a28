// kcp compare A.h5 B.h5 [--delta D | --rtol X --atol Y | --ratio R] [--select LIST]
// Two kcp dumps (root attribute format = "kcp-dump"): /inputs must be identical (a dataset present on
// one side only, another shape or other values FAIL: the results are not comparable), and so must the
// root attributes that define the call (descriptive ones such as producer or rank may differ); every tensor of a
// result group present in both is compared, A as the candidate and B as the reference, under A's
// group policy (or the user's bars, report.h), in kcp check's table; groups and datasets present on
// one side only are listed as SKIP (a kcp run group is expected on one side).
// Any other two HDF5 files (h5diff -d style): every dataset path of either file, matched by path;
// same shape -> one row with max |a-b|, where, rel_l2, fla_ratio and the count of elements that
// differ; the verdict is PASS when every |a-b| <= D (default 0: identical; a NaN never equals), or
// under --rtol/--atol or --ratio. A dataset present on one side only or of another shape is a FAIL
// row, one kcp cannot read as numbers a SKIP row. Exit status: 0 all equal within the bar, 1 a
// difference or (plain HDF5) a one-sided dataset, 2 a file cannot be read, 3 nothing compared.
// Covered by tests/tools/test_kcp_capture.py and tests/validation/test_cli.cpp.
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "app/cli_args.h"
#include "app/commands.h"
#include "app/report.h"
#include "io/dump.h"
#include "io/h5.h"
#include "validation/compare.h"
#include "validation/registry.h"

namespace kcp::app {
using namespace kcp::val;
namespace {

std::string group_attr(const io::DumpGroup& g, const char* key) {
  const io::AttrValue* v = io::attr_find(g.attrs, key);
  const std::string* s = v ? std::get_if<std::string>(v) : nullptr;
  return s ? *s : "";
}

bool is_kcp_dump(const std::string& path) {
  io::H5Id f = io::file_open_read(path);
  const io::Attributes a = io::attrs_read(f.get(), path + ": /");
  const io::AttrValue* v = io::attr_find(a, "format");
  const std::string* s = v ? std::get_if<std::string>(v) : nullptr;
  return s && *s == "kcp-dump";
}

Tally compare_inputs(const io::Dump& a, const io::Dump& b) {
  Tally t;
  const io::DumpGroup &ia = a.inputs(), &ib = b.inputs();  // a layer-only dump: an error naming the file
  for (const io::DumpDataset& y : ib.datasets)
    if (!ia.find(y.name)) report_fail("inputs", y.name, "only in " + b.path + ": the results are not comparable", t);
  for (const io::DumpDataset& x : ia.datasets) {
    const io::DumpDataset* y = ib.find(x.name);
    if (!y) { report_fail("inputs", x.name, "only in " + a.path + ": the results are not comparable", t); continue; }
    if (x.data.shape != y->data.shape) {
      report_fail("inputs", x.name, "shapes differ: " + shape_str(x.data.shape) + " vs " + shape_str(y->data.shape), t);
      continue;
    }
    if (dtype_is_float(x.data.dtype) != dtype_is_float(y->data.dtype)) {
      report_fail("inputs", x.name, "one side holds integers, the other floats", t);
      continue;
    }
    const Metrics m = compare(x.data.view(), y->data.view());
    const bool same = m.max_abs == 0 && m.finite_ok();  // inputs must be equal value for value
    if (same) t.add(Verdict::pass);
    else report_fail("inputs", x.name, "values differ (max_abs " + std::to_string(m.max_abs) + " at " +
                                           index_str(m.max_abs_at) + "): the results are not comparable", t);
  }
  return t;
}

// Root attributes that describe a capture and may differ between two dumps of one call.
bool attr_is_descriptive(const std::string& k) {
  static const std::set<std::string> keys = {
      "format_version", "case", "seed", "producer", "producer_version", "torch_version", "device",
      "source_framework", "source_version", "fla_version", "capture_point", "module_name", "layer_number",
      "iteration", "microbatch", "kernel", "global_rank", "dp_rank", "pp_rank", "assembled_from"};
  return keys.count(k) > 0;
}
// Root attributes kcp may add (kcp run writes the sizes, scale and chunk_size) or that default to the
// single-rank placement: present on one side only is fine, different values are not.
bool attr_may_be_absent(const std::string& k) {
  static const std::set<std::string> keys = {
      "B", "T", "H", "HV", "K", "V", "N", "scale", "chunk_size", "tp_size", "tp_rank", "cp_size", "cp_rank",
      "cp_mode", "cp_partition", "head_offset", "token_offset", "cp_pre_num_ranks", "cp_post_num_ranks",
      "cp_is_first_rank", "cp_is_last_rank", "cp_pre_num_conv_tokens", "assembled_cp_mode", "assembled_cp_size",
      "assembled_tp_size"};
  return keys.count(k) > 0;
}

bool attr_equal(const io::AttrValue& x, const io::AttrValue& y) {
  const double* dx = std::get_if<double>(&x);
  const double* dy = std::get_if<double>(&y);
  if (dx && dy) return *dx == *dy || (std::isnan(*dx) && std::isnan(*dy));  // lower_bound NaN is None
  const int64_t* ix = std::get_if<int64_t>(&x);
  const int64_t* iy = std::get_if<int64_t>(&y);
  if ((dx && iy) || (ix && dy)) return (dx ? *dx : double(*ix)) == (dy ? *dy : double(*iy));
  return x == y;
}

// The root attributes that define the call (op, flags, scale, layout, placement) must agree.
Tally compare_root_attrs(const io::Dump& a, const io::Dump& b) {
  Tally t;
  std::set<std::string> keys;
  for (const auto& [k, v] : a.attrs) keys.insert(k);
  for (const auto& [k, v] : b.attrs) keys.insert(k);
  for (const std::string& k : keys) {
    if (attr_is_descriptive(k)) continue;
    const io::AttrValue *x = io::attr_find(a.attrs, k), *y = io::attr_find(b.attrs, k);
    if (x && y && !attr_equal(*x, *y))
      report_fail("attrs", k, io::attr_describe(*x) + " in " + a.path + ", " + io::attr_describe(*y) + " in " + b.path, t);
    else if ((!x || !y) && !attr_may_be_absent(k))
      report_fail("attrs", k, "only in " + (x ? a.path : b.path) + " (" + io::attr_describe(x ? *x : *y) + ")", t);
    else t.add(Verdict::pass);
  }
  return t;
}

int compare_dumps(const std::string& pa, const std::string& pb, const UserBar& user, const Selection& sel) {
  const io::Dump a = io::dump_read(pa), b = io::dump_read(pb);
  KCP_CHECK(a.op == b.op, "the dumps record different ops: ", a.path, " has ", a.op, ", ", b.path, " has ", b.op);
  std::printf("== %s (candidate) vs %s (reference), op %s\n", a.path.c_str(), b.path.c_str(), a.op.c_str());
  Tally t = compare_inputs(a, b);
  t.user = user;
  std::printf("  inputs: %s\n", t.summary().c_str());
  const Tally attrs = compare_root_attrs(a, b);
  std::printf("  root attributes: %s\n", attrs.summary().c_str());
  t.add(attrs);
  report_header(user);
  const io::DumpGroup* in = a.group("inputs");
  const io::DumpDataset* first = in->find(a.op == "conv1d" ? "x" : "q");
  const DType input = first ? first->source : DType::f32;
  for (const io::DumpGroup* ga : a.result_groups()) {
    const io::DumpGroup* gb = b.group(ga->name);
    if (!gb) { report_skip(ga->name, "*", "group only in " + a.path, t); continue; }
    const Producer prod = producer_of(ga->name, group_attr(*ga, "producer"), group_attr(*ga, "compute"));
    for (const io::DumpDataset& x : ga->datasets) {
      if (!sel.matches(ga->name, x.name)) continue;
      const io::DumpDataset* y = gb->find(x.name);
      if (!y) report_skip(ga->name, x.name, "only in " + a.path, t);
      else if (x.data.shape != y->data.shape) report_fail(ga->name, x.name, "shapes differ", t);
      else if (!dtype_is_float(x.data.dtype) || !dtype_is_float(y->data.dtype))
        report_skip(ga->name, x.name, "not floats", t);
      else report_tensor(ga->name, x.name, x.data.view(), y->data.view(), x.source,
                         bar_for(prod, a.op, x.name, x.source, input), t);
    }
    for (const io::DumpDataset& y : gb->datasets)
      if (!ga->find(y.name) && sel.matches(ga->name, y.name)) report_skip(ga->name, y.name, "only in " + b.path, t);
  }
  for (const io::DumpGroup* gb : b.result_groups())
    if (!a.group(gb->name)) report_skip(gb->name, "*", "group only in " + b.path, t);
  std::printf("kcp compare: %s\n", t.summary().c_str());
  return t.fail ? 1 : 0;
}

// Every dataset of an HDF5 file, by full path.
void list_datasets(hid_t loc, const std::string& prefix, const std::string& file, std::vector<std::string>& out) {
  const io::Members m = io::group_members(loc, file + ": " + (prefix.empty() ? "/" : prefix));
  for (const std::string& d : m.datasets) out.push_back(prefix + "/" + d);
  for (const std::string& g : m.groups) {
    io::H5Id sub = io::group_open(loc, g, file + ": " + prefix + "/" + g);
    list_datasets(sub.get(), prefix + "/" + g, file, out);
  }
}

struct Generic {
  io::H5Id file;
  std::vector<std::string> paths;
};

Generic open_generic(const std::string& path) {
  Generic g{io::file_open_read(path), {}};
  list_datasets(g.file.get(), "", path, g.paths);
  return g;
}

void generic_row(const std::string& path, const io::Array& x, const io::Array& y, double delta, Tally& t) {
  if (!t.user.any()) {  // h5diff -d: every |a-b| <= delta
    const Metrics m = compare(x.view(), y.view());
    const Tensor<double> a = to_tensor<double>(x.view()), b = to_tensor<double>(y.view());
    int64_t over = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double p = a.data()[i], q = b.data()[i];
      const bool nonfinite = std::isnan(p) || std::isnan(q) || std::isinf(p) || std::isinf(q);
      over += nonfinite ? !(p == q) : std::abs(p - q) > delta;  // NaN never equals; Inf only the same Inf
    }
    const Verdict v = over ? Verdict::fail : Verdict::pass;
    t.add(v);
    std::printf("  %-30s %-16s %9.2e %-18s %9.2e %9.2e %10lld/%-10lld %s\n", path.c_str(), shape_str(x.shape).c_str(),
                m.max_abs, index_str(m.max_abs_at).c_str(), m.rel_l2, m.fla_ratio, static_cast<long long>(over),
                static_cast<long long>(m.n), std::string(verdict_name(v)).c_str());
    return;
  }
  report_tensor("", path, x.view(), y.view(), x.dtype, Bar{0, false, false, ""}, t);
}

int compare_generic(const std::string& pa, const std::string& pb, const UserBar& user, double delta,
                    const Selection& sel) {
  const Generic a = open_generic(pa), b = open_generic(pb);
  const std::string bar = user.any() ? user.describe() : "h5diff -d " + std::to_string(delta) + ": |a-b| <= delta";
  std::printf("== %s vs %s: HDF5 datasets matched by path (%s)\n", pa.c_str(), pb.c_str(), bar.c_str());
  Tally t;
  t.user = user;
  if (user.any()) report_header(user);
  else std::printf("  %-30s %-16s %9s %-18s %9s %9s %21s %s\n", "dataset", "shape", "max_abs", "at", "rel_l2",
                   "fla_ratio", "differ", "verdict");
  std::map<std::string, int> side;  // 1: A only, 2: B only, 3: both
  for (const std::string& p : a.paths) side[p] |= 1;
  for (const std::string& p : b.paths) side[p] |= 2;
  for (const auto& [p, s] : side) {
    if (!sel.matches("", p) && !sel.matches("", p.substr(1))) continue;
    if (s != 3) { report_fail("", p, "only in " + (s == 1 ? pa : pb), t); continue; }
    io::StoredArray x, y;
    try {
      x = io::dataset_read(a.file.get(), p, pa + ": " + p), y = io::dataset_read(b.file.get(), p, pb + ": " + p);
    } catch (const Error& e) {
      report_skip("", p, std::string("not numbers kcp reads: ") + e.what(), t);
      continue;
    }
    if (x.data.shape != y.data.shape)
      report_fail("", p, "shapes differ: " + shape_str(x.data.shape) + " vs " + shape_str(y.data.shape), t);
    else generic_row(p, x.data, y.data, delta, t);
  }
  std::printf("kcp compare: %zu dataset path(s), %s\n", side.size(), t.summary().c_str());
  return t.fail ? 1 : t.judged() == 0 ? 3 : 0;
}

}  // namespace

int cmd_compare(int argc, char** argv) {
  Args args(argc, argv, {"delta", "rtol", "atol", "ratio", "select"}, {}, "compare");
  KCP_CHECK(args.positional().size() == 2, "usage: kcp compare A.h5 B.h5 [options] (kcp compare --help)");
  UserBar user;
  if (args.has("ratio")) user.ratio = args.get_double("ratio", 0);
  KCP_CHECK(args.has("rtol") == args.has("atol"), "--rtol and --atol go together: give both");
  if (args.has("rtol")) user.rtol = args.get_double("rtol", 0), user.atol = args.get_double("atol", 0);
  const double delta = args.get_double("delta", 0);
  KCP_CHECK(!(args.has("delta") && user.any()), "--delta is the generic bar; do not combine it with --rtol/--ratio");
  const Selection sel = parse_selection(args.get("select", ""));
  const std::string& pa = args.positional()[0];
  const std::string& pb = args.positional()[1];
  if (is_kcp_dump(pa) && is_kcp_dump(pb) && !args.has("delta")) return compare_dumps(pa, pb, user, sel);
  return compare_generic(pa, pb, user, delta, sel);
}

}  // namespace kcp::app
