// kcp run, kcp info and kcp assemble: the dump commands besides check and compare (cmd_compare.cpp).
//   run --backend NAME --in X.h5 --out Y.h5 [--precision f64|f32]: Y = X plus a result group named
//       after the backend (producer = kcp), written atomically.
//   info FILE: attributes, decoded problem, placement, and every dataset with its storage.
//   assemble --out G.h5 SHARD...: the global dump of a TP/CP run from its per-rank files.
// Covered by tests/validation/test_cli.cpp.
#include <cmath>
#include <cstdio>
#include <set>

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
  Args a(argc, argv, {"backend", "in", "out", "precision"}, {}, "run");
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
  else std::printf("  problem: %s\n", describe_conv1d_call(io::dump_conv1d_call(d)).c_str());
  for (const io::DumpGroup& g : d.groups) {
    std::printf("  /%s%s\n", g.name.c_str(), io::group_is_reserved(g.name) ? "" : "  (results)");
    print_attrs(g.attrs, "    @");
    for (const io::DumpDataset& ds : g.datasets) print_dataset(ds);
  }
  return 0;
}

int cmd_assemble(int argc, char** argv) {
  Args args(argc, argv, {"out"}, {}, "assemble");
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
