// kcp check [--backend NAME] [--precision f64|f32] [--write FILE] [--select LIST] [--ratio R]
//           [--rtol X --atol Y] [--json FILE] [--plot DIR] PATH...
// For each dump (folders expand to their *.h5): run the backend (default: the float64 token
// recurrence) on /inputs with the file's flags, compare every tensor of every result group with the
// backend's result under the policy (policy.h) or the user's bars (report.h), print one row per
// (group, tensor); a chunkwise CP rank file with FLA's transitions (/debug/cp_transition_fwd, _bwd) also
// gets rows debug/cp_transition_*.{S,M,dS,MT} against the oracle's (validation/cp_transition_check.h).
// Exit status: 0 when nothing fails (warnings allowed), 1 when a tensor fails, 2 when
// a file cannot be checked, 3 when nothing was judged (no result group, every tensor skipped, or
// --select matched nothing). --write FILE keeps the dump plus the oracle's results as a group (a
// folder when several PATHs); --json FILE writes every verdict (json_out.h); --plot DIR draws the
// error of every failing or selected tensor (plot.h). A file whose oracle runs longer than 3 s
// prints its elapsed time on stderr every few seconds. Each file is read and checked in a child
// process (app/isolate.h): a crash or hang of the HDF5 library on a corrupt file is one error line for
// that file, and the next file is still checked; its JSON record comes back through the isolation.
// Covered by tests/validation/test_cli.cpp, test_cp_transition.cpp and the `golden` ctest label (docs/GOLDEN.md).
#include <algorithm>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "io/dump.h"
#include "app/cli_args.h"
#include "app/json_out.h"
#include "app/plot.h"
#include "app/commands.h"
#include "app/isolate.h"
#include "validation/cp_transition_check.h"
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
struct CheckOptions {
  DType compute = DType::f64;
  std::string write_to, plot_dir;
  Selection select;
};

// Progress on stderr while the oracle runs: silent for the first 3 s, then every 5 s.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), thread_([this] { loop(); }) {}
  ~Progress() {
    { std::lock_guard<std::mutex> l(m_); done_ = true; }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> l(m_);
    for (int wait_s = 3; !cv_.wait_for(l, std::chrono::seconds(wait_s), [this] { return done_; }); wait_s = 5) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "kcp check: %s: %.0f s\n", what_.c_str(), s);
    }
  }
  std::string what_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

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
void check_layer_file(const io::Dump& d, const CheckOptions& o, CheckedFile& f) {
  const LayerCheck lc = layer_check(read_layer_call(d));
  f.description = "layer " + lc.description, f.input_dtype = "-", f.placement = "layer capture";
  std::printf("== %s: layer %s\n   kcp-dump v%lld, capture_point layer, oracle float64 (layer oracle)\n",
              d.path.c_str(), lc.description.c_str(), static_cast<long long>(d.version));
  Tally& t = f.tally;
  if (lc.pairs.empty()) std::printf("   no layer outputs or stages stored: nothing to compare\n");
  else report_header(t.user);
  for (const LayerPair& p : lc.pairs) {
    if (!o.select.matches(p.stage, p.tensor)) continue;
    if (!p.problem.empty()) report_fail(p.stage, p.tensor, p.problem, t);
    else report_tensor(p.stage, p.tensor, p.candidate.view(), p.oracle.view(), p.stored, p.bar, t);
  }
  const int first = layer_first_departure(lc);
  if (first < 0) std::printf("   no stage departs from the oracle\n");
  else
    std::printf("   first departure: stage '%s' (tensor %s); later stages inherit it\n",
                lc.pairs[size_t(first)].stage.c_str(), lc.pairs[size_t(first)].tensor.c_str());
  std::printf("   %s\n", t.summary().c_str());
}

// FLA's per-rank CP transitions (/debug/cp_transition_*, validation/cp_transition_check.h) against the
// oracle's transition of the same local sequence, on a host backend (cpu-recurrent where `be` is not).
void check_transitions(Backend& be, const io::Dump& d, const CheckOptions& o, Tally& t) {
  if (std::none_of(std::begin(kTransitionRows), std::end(kTransitionRows),
                   [&](const char* n) { return o.select.matches(kTransitionGroup, n); }))
    return;  // --select left none of them
  std::unique_ptr<Backend> own = be.device() == Device::host ? nullptr : backend_create("cpu-recurrent");
  const std::vector<TransitionPair> pairs = [&] {
    Progress progress(d.path + ": the oracle's CP transitions");
    return cp_transition_pairs(own ? *own : be, d, o.compute);
  }();
  for (const TransitionPair& p : pairs) {
    if (!o.select.matches(kTransitionGroup, p.tensor)) continue;
    if (!p.skip.empty()) report_skip(kTransitionGroup, p.tensor, p.skip, t);
    else if (!p.problem.empty()) report_fail(kTransitionGroup, p.tensor, p.problem, t);
    else report_tensor(kTransitionGroup, p.tensor, p.candidate.view(), p.oracle.view(), p.stored, p.bar, t);
  }
}

void check_file(Backend& be, const std::string& path, const CheckOptions& o, const std::string& write_to,
                CheckedFile& f) {
  const io::Dump d = io::dump_read(path);
  if (is_layer_dump(d)) return check_layer_file(d, o, f);
  const DumpRun run = [&] {
    Progress progress(path + ": running the oracle (" + std::string(be.name()) + ")");
    return run_dump(be, d, o.compute);
  }();
  f.description = run.description, f.input_dtype = std::string(dtype_name(run.input_dtype));
  f.placement = run.placement.describe();
  std::printf("== %s: %s\n   kcp-dump v%lld, input %s, %s\n", path.c_str(), run.description.c_str(),
              static_cast<long long>(d.version), f.input_dtype.c_str(), f.placement.c_str());
  Tally& t = f.tally;
  const auto groups = d.result_groups();
  const bool transitions = has_cp_transitions(d);
  if (groups.empty()) std::printf("   no result groups: nothing to compare (kcp run adds one)\n");
  if (!groups.empty() || transitions) report_header(t.user);
  for (const io::DumpGroup* g : groups) {
    const Producer prod = producer_of(g->name, group_attr(*g, "producer"), group_attr(*g, "compute"));
    for (const io::DumpDataset& ds : g->datasets) {
      if (!o.select.matches(g->name, ds.name)) continue;
      const size_t before = t.rows.size();
      check_dataset(d, run, *g, prod, ds, t);
      if (o.plot_dir.empty() || t.rows.size() == before) continue;
      const Row& row = t.rows.back();
      const bool wanted = row.verdict == "FAIL" || row.verdict == "WARN" || !o.select.all();
      auto it = run.results.find(ds.name);
      if (wanted && row.measured && it != run.results.end())
        plot_tensor(o.plot_dir, d, g->name, ds.name, ds.data.view(), it->second.view(), row, t.user);
    }
  }
  if (transitions) check_transitions(be, d, o, t);
  if (!write_to.empty()) {
    io::Dump out = d;
    io::DumpGroup g = results_group(run.group, run.results, run.group, o.compute);
    out.add_group(g.name) = std::move(g);
    io::dump_write(write_to, out);
    std::printf("   wrote %s (group /%s)\n", write_to.c_str(), run.group.c_str());
  }
  std::printf("   %s\n", t.summary().c_str());
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

UserBar parse_user_bar(const Args& a) {
  UserBar u;
  if (a.has("ratio")) u.ratio = a.get_double("ratio", 0);
  KCP_CHECK(a.has("rtol") == a.has("atol"), "--rtol and --atol go together (as in torch.testing.assert_close): "
            "give both");
  if (a.has("rtol")) u.rtol = a.get_double("rtol", 0), u.atol = a.get_double("atol", 0);
  for (auto [name, v] : {std::pair{"ratio", u.ratio}, {"rtol", u.rtol}, {"atol", u.atol}})
    KCP_CHECK(!v || (*v >= 0 && std::isfinite(*v)), "--", name, ": expected a finite number >= 0, got ", *v);
  return u;
}

int cmd_check(int argc, char** argv) {
  Args a(argc, argv, {"backend", "precision", "write", "json", "select", "ratio", "rtol", "atol", "plot"}, {}, "check");
  const std::vector<std::string> files = expand_dump_paths(a.positional());
  KCP_CHECK(!files.empty(), "no dump given (usage: kcp check [options] PATH...; kcp check --help)");
  CheckOptions o;
  o.compute = parse_precision(a.get("precision", "f64"));
  o.select = parse_selection(a.get("select", ""));
  o.plot_dir = a.get("plot", "");
  const UserBar user = parse_user_bar(a);
  // With isolation each file's child creates the backend (a CUDA context does not survive fork);
  // the parent only checks the name, or creates it once when files are read in-process.
  const std::string backend = a.get("backend", "cpu-recurrent");
  const std::vector<std::string> known = backend_names();
  std::unique_ptr<Backend> shared;
  if (!isolation_enabled() || std::find(known.begin(), known.end(), backend) == known.end())
    shared = backend_create(backend);  // an unknown name throws here, once
  Tally total;
  std::vector<std::string> checked;  // each file's JSON record
  int unreadable = 0;
  for (const std::string& f : files) {
    const std::string target = write_target(a.get("write", ""), f, files.size());
    const Isolated r = run_isolated_payload(f, "kcp check", [&](Tally& t, std::string& record) {
      CheckedFile cf;
      cf.path = f, cf.tally.user = user;
      try {
        std::unique_ptr<Backend> own = shared ? nullptr : backend_create(backend);
        check_file(shared ? *shared : *own, f, o, target, cf);
      } catch (const std::exception& e) {
        cf.error = e.what();
        record = checked_file_json(cf);
        throw;  // printed and counted by the isolation
      }
      t = cf.tally;
      record = checked_file_json(cf);
      return 0;
    });
    total.add(r.tally);
    unreadable += r.status == 2;
    if (r.payload.empty()) {  // the child died (a signal, a time limit) before writing its record
      CheckedFile cf;
      cf.path = f, cf.error = r.error.empty() ? "not checked" : r.error;
      checked.push_back(checked_file_json(cf));
    } else {
      checked.push_back(r.payload);
    }
  }
  const int status = unreadable ? 2 : total.fail ? 1 : total.judged() == 0 ? 3 : 0;
  std::printf("kcp check: %zu file(s), %s%s\n", files.size(), total.summary().c_str(),
              unreadable ? (", " + std::to_string(unreadable) + " not checked (errors above)").c_str() : "");
  if (status == 3)
    std::printf("kcp check: nothing was judged (%s): exit status 3\n",
                o.select.all() ? "no result group, or every tensor skipped" : "--select matched no judged tensor");
  if (a.has("json")) write_check_json(a.get("json", ""), checked, total, user, status);
  return status;
}

}  // namespace kcp::app
