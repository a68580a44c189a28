// kcp check [--backend NAME] [--precision f64|f32] [--write FILE] PATH...
// For each dump (folders expand to their *.h5): run the backend (default: the float64 token
// recurrence) on /inputs with the file's flags, compare every tensor of every result group with the
// backend's result under the policy (policy.h), print one row per (group, tensor). Exit status:
// 0 when nothing fails (warnings allowed), 1 when a tensor fails, 2 when a file cannot be checked.
// --write FILE keeps the dump plus the oracle's results as a group (a folder when several PATHs).
// Covered by tests/validation/test_cli.cpp and the `golden` ctest label (docs/GOLDEN.md).
#include <cstdio>
#include <filesystem>

#include "io/dump.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "validation/dump_runner.h"
#include "validation/layer_check.h"
#include "validation/registry.h"
#include "app/report.h"

namespace kcp::app {
using namespace kcp::val;
namespace {

// o / y of a chunkwise CP shard need only the earlier ranks' states; a final state or a gradient
// also depends on later ranks (a sequence that continues there).
bool is_output_tensor(std::string_view name) { return name == "o" || name == "y"; }
// Results of the forward pass (the rest are gradients).
bool is_forward_result(std::string_view name) { return is_output_tensor(name) || name == "final_state"; }

// One dataset of a result group against the oracle's result of the same name.
void check_dataset(const io::Dump& d, const DumpRun& run, const io::DumpGroup& g, Producer prod,
                   const io::DumpDataset& ds, Tally& t) {
  if (!io::result_name_known(d.op, ds.name))
    return report_skip(g.name, ds.name, "not a result of " + d.op + " (nothing to compare with)", t);
  auto it = run.results.find(ds.name);
  if (it == run.results.end() && !run.backward_skipped.empty() && !is_forward_result(ds.name))
    return report_skip(g.name, ds.name, "gradient not computed: " + run.backward_skipped, t);
  if (it == run.results.end())
    return report_skip(g.name, ds.name, "not computed: its input or /inputs/do is absent", t);
  const bool fwd = is_output_tensor(ds.name);
  if (fwd ? !run.placement.forward_self_contained() : !run.placement.backward_self_contained())
    return report_skip(g.name, ds.name, "chunkwise CP shard (" + run.placement.describe() +
                                            "): depends on other ranks; check the reassembled file", t);
  if (ds.data.shape != it->second.shape)
    return report_fail(g.name, ds.name, "shape " + shape_str(ds.data.shape) + ", the oracle's is " +
                                            shape_str(it->second.shape), t);
  if (!dtype_is_float(ds.data.dtype))
    return report_fail(g.name, ds.name, "stored as " + std::string(dtype_name(ds.data.dtype)) + ", not floats", t);
  const Bar bar = bar_for(prod, d.op, ds.name, ds.source, run.input_dtype);
  report_tensor(g.name, ds.name, ds.data.view(), it->second.view(), ds.source, bar, t);
}

std::string group_attr(const io::DumpGroup& g, const char* key) {
  const io::AttrValue* v = io::attr_find(g.attrs, key);
  const std::string* s = v ? std::get_if<std::string>(v) : nullptr;
  return s ? *s : "";
}

// A layer capture: every stored stage against the float64 layer oracle, in pipeline order, then the
// stage where the producer first departs (validation/layer_check.h).
Tally check_layer_file(const io::Dump& d) {
  const LayerCheck lc = layer_check(read_layer_call(d));
  std::printf("== %s: layer %s\n   kcp-dump v%lld, capture_point layer, oracle float64 (layer oracle)\n",
              d.path.c_str(), lc.description.c_str(), static_cast<long long>(d.version));
  Tally t;
  if (lc.pairs.empty()) std::printf("   no layer outputs or stages stored: nothing to compare\n");
  else report_header();
  for (const LayerPair& p : lc.pairs) {
    if (!p.problem.empty()) report_fail(p.stage, p.tensor, p.problem, t);
    else report_tensor(p.stage, p.tensor, p.candidate.view(), p.oracle.view(), p.stored, p.bar, t);
  }
  const int first = layer_first_departure(lc);
  if (first < 0) std::printf("   no stage departs from the oracle\n");
  else
    std::printf("   first departure: stage '%s' (tensor %s); later stages inherit it\n",
                lc.pairs[size_t(first)].stage.c_str(), lc.pairs[size_t(first)].tensor.c_str());
  std::printf("   %s\n", t.summary().c_str());
  return t;
}

Tally check_file(Backend& be, const std::string& path, DType compute, const std::string& write_to) {
  const io::Dump d = io::dump_read(path);
  if (is_layer_dump(d)) return check_layer_file(d);
  const DumpRun run = run_dump(be, d, compute);
  std::printf("== %s: %s\n   kcp-dump v%lld, input %s, %s\n", path.c_str(), run.description.c_str(),
              static_cast<long long>(d.version), std::string(dtype_name(run.input_dtype)).c_str(),
              run.placement.describe().c_str());
  Tally t;
  const auto groups = d.result_groups();
  if (groups.empty()) std::printf("   no result groups: nothing to compare (kcp run adds one)\n");
  else report_header();
  for (const io::DumpGroup* g : groups) {
    const Producer prod = producer_of(g->name, group_attr(*g, "producer"), group_attr(*g, "compute"));
    for (const io::DumpDataset& ds : g->datasets) check_dataset(d, run, *g, prod, ds, t);
  }
  if (!write_to.empty()) {
    io::Dump out = d;
    io::DumpGroup g = results_group(run.group, run.results, run.group, compute);
    out.add_group(g.name) = std::move(g);
    io::dump_write(write_to, out);
    std::printf("   wrote %s (group /%s)\n", write_to.c_str(), run.group.c_str());
  }
  std::printf("   %s\n", t.summary().c_str());
  return t;
}

// Where --write puts the file for `input`: FILE itself for one input, FILE/<name> for several.
std::string write_target(const std::string& opt, const std::string& input, size_t n_inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (opt.empty()) return "";
  if (n_inputs == 1 && !fs::is_directory(opt, ec)) return opt;
  fs::create_directories(opt, ec);
  KCP_CHECK(!ec, "--write ", opt, ": cannot create the folder: ", ec.message());
  return (fs::path(opt) / fs::path(input).filename()).string();
}

}  // namespace

int cmd_check(int argc, char** argv) {
  Args a(argc, argv, {"backend", "precision", "write"}, {});
  const std::vector<std::string> files = expand_dump_paths(a.positional());
  KCP_CHECK(!files.empty(), "no dump given (usage: kcp check [--backend NAME] [--precision f64|f32] "
            "[--write FILE] PATH...)");
  const DType compute = parse_precision(a.get("precision", "f64"));
  std::unique_ptr<Backend> be = backend_create(a.get("backend", "cpu-recurrent"));
  Tally total;
  int unreadable = 0;
  for (const std::string& f : files) {
    try {
      total.add(check_file(*be, f, compute, write_target(a.get("write", ""), f, files.size())));
    } catch (const Error& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "kcp check: error: %s\n", e.what());
      ++unreadable;
    }
  }
  std::printf("kcp check: %zu file(s), %s%s\n", files.size(), total.summary().c_str(),
              unreadable ? (", " + std::to_string(unreadable) + " not checked (errors above)").c_str() : "");
  return unreadable ? 2 : total.fail ? 1 : 0;
}

}  // namespace kcp::app
