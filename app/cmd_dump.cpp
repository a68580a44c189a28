// kcp run, kcp compare and kcp info: the dump commands besides check.
//   run --backend NAME --in X.h5 --out Y.h5 [--precision f64|f32]: Y = X plus a result group named
//       after the backend (producer = kcp), written atomically.
//   compare A.h5 B.h5: /inputs must be identical; every tensor of a result group present in both is
//       compared, A as the candidate and B as the reference, under A's group policy. Exit as check.
//   info FILE: attributes, decoded problem, placement, and every dataset with its storage.
//   assemble --out G.h5 SHARD...: the global dump of a TP/CP run from its per-rank files.
// Covered by tests/validation/test_cli.cpp.
#include <cmath>
#include <cstdio>

#include "io/dump.h"
#include "io/dump_assemble.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "validation/compare.h"
#include "validation/dump_runner.h"
#include "validation/layer_check.h"
#include "validation/registry.h"
#include "app/report.h"

namespace kcp::app {
using namespace kcp::val;
namespace {

std::string group_attr(const io::DumpGroup& g, const char* key) {
  const io::AttrValue* v = io::attr_find(g.attrs, key);
  const std::string* s = v ? std::get_if<std::string>(v) : nullptr;
  return s ? *s : "";
}

// The sizes of schema version 2, written next to the flags.
void add_size_attrs(io::Dump& d, DType compute) {
  if (d.op == "conv1d") return;
  const Problem p = io::dump_op_call(d, compute).problem;
  const std::pair<const char*, int64_t> sizes[] = {{"B", p.B}, {"T", p.T}, {"H", p.H}, {"HV", p.HV},
                                                   {"K", p.K}, {"V", p.V}, {"N", p.N}};
  for (auto [k, v] : sizes) d.attrs[k] = v;
  d.attrs["scale"] = p.scale;
  d.attrs["chunk_size"] = p.chunk_size;
}

Tally compare_inputs(const io::Dump& a, const io::Dump& b) {
  Tally t;
  const io::DumpGroup &ia = a.inputs(), &ib = b.inputs();
  for (const io::DumpDataset& x : ia.datasets) {
    const io::DumpDataset* y = ib.find(x.name);
    if (!y) { report_skip("inputs", x.name, "only in " + a.path, t); continue; }
    if (x.data.shape != y->data.shape) {
      report_fail("inputs", x.name, "shapes differ: " + shape_str(x.data.shape) + " vs " + shape_str(y->data.shape), t);
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

std::string number_str(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);  // scale = 0.1767766953, not 0.176777
  return buf;
}

void print_attrs(const io::Attributes& attrs, const char* indent) {
  for (const auto& [k, v] : attrs) {
    std::string s;
    if (const std::string* str = std::get_if<std::string>(&v)) s = "'" + *str + "'";
    else if (const double* d = std::get_if<double>(&v)) s = number_str(*d);
    else if (const int64_t* i = std::get_if<int64_t>(&v)) s = std::to_string(*i);
    else if (const bool* b = std::get_if<bool>(&v)) s = *b ? "TRUE" : "FALSE";
    else s = io::attr_describe(v);
    std::printf("%s%s = %s\n", indent, k.c_str(), s.c_str());
  }
}

void print_dataset(const io::DumpDataset& ds) {
  double mn = INFINITY, mx = -INFINITY, ss = 0;
  const Tensor<double> x = to_tensor<double>(ds.data.view());
  for (double v : x.vec()) mn = std::min(mn, v), mx = std::max(mx, v), ss += v * v;
  const double rms = x.numel() ? std::sqrt(ss / double(x.numel())) : 0.0;
  std::printf("    %-16s %-18s stored %-8s dtype %-8s %-10s min % .4e max % .4e rms %.4e\n", ds.name.c_str(),
              shape_str(ds.data.shape).c_str(), std::string(dtype_name(ds.data.dtype)).c_str(),
              std::string(dtype_name(ds.source)).c_str(), std::string(io::encoding_name(ds.encoding)).c_str(), mn, mx,
              rms);
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Args a(argc, argv, {"backend", "in", "out", "precision"}, {});
  KCP_CHECK(a.has("backend") && a.has("in") && a.has("out"),
            "usage: kcp run --backend NAME --in X.h5 --out Y.h5 [--precision f64|f32]");
  const DType compute = parse_precision(a.get("precision", "f64"));
  std::unique_ptr<Backend> be = backend_create(a.get("backend", ""));
  io::Dump d = io::dump_read(a.get("in", ""));
  const DumpRun run = run_dump(*be, d, compute);
  add_size_attrs(d, compute);
  io::DumpGroup g = results_group(run.group, run.results, run.group, compute);
  d.add_group(g.name) = std::move(g);
  io::dump_write(a.get("out", ""), d);
  std::printf("kcp run: %s\n  wrote %s with group /%s:", run.description.c_str(), a.get("out", "").c_str(),
              run.group.c_str());
  for (const auto& [n, arr] : run.results) std::printf(" %s", n.c_str());
  std::printf("\n");
  return 0;
}

int cmd_compare(int argc, char** argv) {
  Args args(argc, argv, {}, {});
  KCP_CHECK(args.positional().size() == 2, "usage: kcp compare A.h5 B.h5");
  const io::Dump a = io::dump_read(args.positional()[0]), b = io::dump_read(args.positional()[1]);
  KCP_CHECK(a.op == b.op, "the dumps record different ops: ", a.path, " has ", a.op, ", ", b.path, " has ", b.op);
  std::printf("== %s (candidate) vs %s (reference), op %s\n", a.path.c_str(), b.path.c_str(), a.op.c_str());
  Tally t = compare_inputs(a, b);
  std::printf("  inputs: %s\n", t.summary().c_str());
  report_header();
  const DType input = a.inputs().find(a.op == "conv1d" ? "x" : "q")
                          ? a.inputs().find(a.op == "conv1d" ? "x" : "q")->source : DType::f32;
  for (const io::DumpGroup* ga : a.result_groups()) {
    const io::DumpGroup* gb = b.group(ga->name);
    if (!gb) { report_skip(ga->name, "*", "group only in " + a.path, t); continue; }
    const Producer prod = producer_of(ga->name, group_attr(*ga, "producer"), group_attr(*ga, "compute"));
    for (const io::DumpDataset& x : ga->datasets) {
      const io::DumpDataset* y = gb->find(x.name);
      if (!y) report_skip(ga->name, x.name, "only in " + a.path, t);
      else if (x.data.shape != y->data.shape) report_fail(ga->name, x.name, "shapes differ", t);
      else if (!dtype_is_float(x.data.dtype) || !dtype_is_float(y->data.dtype))
        report_skip(ga->name, x.name, "not floats", t);
      else report_tensor(ga->name, x.name, x.data.view(), y->data.view(), x.source,
                         bar_for(prod, a.op, x.name, x.source, input), t);
    }
  }
  std::printf("kcp compare: %s\n", t.summary().c_str());
  return t.fail ? 1 : 0;
}

int cmd_info(int argc, char** argv) {
  Args args(argc, argv, {}, {});
  KCP_CHECK(args.positional().size() == 1, "usage: kcp info FILE");
  const io::Dump d = io::dump_read(args.positional()[0]);
  std::printf("%s: kcp-dump v%lld, op %s\n", d.path.c_str(), static_cast<long long>(d.version), d.op.c_str());
  print_attrs(d.attrs, "  ");
  std::printf("  placement: %s\n", io::dump_placement(d).describe().c_str());
  if (val::is_layer_dump(d))
    std::printf("  layer: %s\n", val::layer_check_description(val::read_layer_call(d)).c_str());
  else if (d.op != "conv1d")
    std::printf("  problem: %s\n", io::dump_op_call(d, DType::f64).problem.describe().c_str());
  for (const io::DumpGroup& g : d.groups) {
    std::printf("  /%s%s\n", g.name.c_str(), io::group_is_reserved(g.name) ? "" : "  (results)");
    print_attrs(g.attrs, "    @");
    for (const io::DumpDataset& ds : g.datasets) print_dataset(ds);
  }
  return 0;
}

int cmd_assemble(int argc, char** argv) {
  Args args(argc, argv, {"out"}, {});
  const std::vector<std::string> files = expand_dump_paths(args.positional());
  KCP_CHECK(args.has("out") && !files.empty(), "usage: kcp assemble --out G.h5 SHARD... (files or folders)");
  std::vector<io::Dump> shards;
  for (const std::string& f : files) shards.push_back(io::dump_read(f));
  io::Dump g = io::dump_assemble(shards);
  add_size_attrs(g, DType::f64);  // also decodes the global problem: a bad assembly fails here
  io::dump_write(args.get("out", ""), g);
  std::printf("kcp assemble: %zu shards -> %s (%s)\n", shards.size(), args.get("out", "").c_str(),
              g.op == "conv1d" ? "conv1d" : io::dump_op_call(g, DType::f64).problem.describe().c_str());
  return 0;
}

}  // namespace kcp::app
