// kcp cp-sweep: context parallelism against the single-process oracle over the matrix
// variants x flag sets x states x layouts (sweep_cases.h) x backends x float64/float32 x merges, then
// conv1d with W = 2, 3, 4 over the same layouts, then the whole layer over the same layouts
// (cp_sweep_layer.h: its ops on the host, its kernel on each backend, host or device). One row per
// case from rank 0, a summary line, exit code 1 when any row failed on any rank (the verdict is
// all-reduced, so every rank exits alike).
//   mpirun -np N [--oversubscribe] build/kcp cp-sweep [--quick] [--backend NAME|all] [--seed S]
//          [--filter TEXT] [--merge linear|log-depth|both] [--precision f64|f32|both]
//          [--comm auto|mpi|nccl] [--timeout SECONDS]
// Device backends run on the GPU of the rank's local rank (ranks share GPUs round-robin under
// --comm mpi); --comm auto picks NCCL when every rank has its own GPU and NCCL loads, else staged MPI.
// A backend without a backward for a case runs its forward rows (o, ht) only.
// --quick halves the matrix (states and merges alternate between cases) on smaller sizes.
// Covered by tests/cp/CMakeLists.txt (N = 1, 2, 3, 4).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cp/comm_device.h"
#include "cp/comm_mpi.h"
#include "cp/watchdog.h"
#include "app/cp_sweep_layer.h"
#include "app/cp_sweep_run.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "validation/registry.h"
#include "validation/tolerance.h"

namespace kcp::app {
using namespace kcp::val;
using namespace kcp::cp;
namespace {

struct SweepOptions {
  bool quick = false;
  std::string backend = "all", filter, merge = "both", precision = "both";
  uint64_t seed = 0;
  CommKind comm = CommKind::automatic;
};

struct Tally {
  int rows = 0, failed = 0, skipped = 0, notes = 0;
  double worst_f64 = 0, worst_f32 = 0;  // worst err/bar
  void add(const RowVerdict& v, DType dt) {
    ++rows;
    failed += !v.pass;
    double& w = dt == DType::f64 ? worst_f64 : worst_f32;
    w = std::max(w, v.worst_ratio);
  }
};

struct BackendSlot {
  std::string name;
  std::unique_ptr<Backend> backend;  // null when it cannot be created (the reason is printed)
  DataComm data;                     // the communicator on this backend's memory
};

// The backends of the sweep: every built backend (or the one asked for). A device backend runs on
// the GPU of this rank's local rank (shared round-robin when there are fewer GPUs than ranks).
std::vector<BackendSlot> open_backends(Comm& world, const SweepOptions& o, Tally& t) {
  std::vector<BackendSlot> out;
  const int gpus = val::gpu_count();
  for (const std::string& name : val::backend_names()) {
    if (o.backend != "all" && o.backend != name) continue;
    std::string why;
    try {
      val::BackendOptions bo;
      bo.device = gpus > 0 ? cp::local_rank() % gpus : -1;
      BackendSlot b{name, val::backend_create(name, bo), {}};
      b.data = make_data_comm(world, b.backend->queue(), o.comm, gpus);
      out.push_back(std::move(b));
    } catch (const std::exception& e) {
      why = e.what();
    }
    // every rank must open the same backends, or the collectives of the rows would not match
    int32_t failed = why.empty() ? 0 : 1;
    all_reduce_max(world, &failed, 1);
    if (!failed) continue;
    if (why.empty()) why = "it could not be opened on another rank", out.pop_back();
    KCP_CHECK(o.backend == "all", "--backend ", name, ": ", why);
    if (world.rank() == 0) std::printf("SKIP  backend %s: %s (its rows are not run)\n", name.c_str(), why.c_str());
    ++t.skipped;
  }
  return out;
}

void print_row(int rank, const RowVerdict& v, const std::string& what) {
  if (rank != 0) return;
  std::printf("%s  %s | %s | worst %.2f of bar\n", v.pass ? "PASS" : "FAIL", what.c_str(), v.errors.c_str(),
              v.worst_ratio);
  if (!v.pass) std::printf("      %s\n", v.failure.c_str());
  std::fflush(stdout);
}

// Agrees on a row's verdict: failed on any rank means failed.
void reduce_verdict(Comm& comm, RowVerdict& v) {
  int32_t fail = v.pass ? 0 : 1;
  all_reduce_max(comm, &fail, 1);
  if (fail && v.pass) v.pass = false, v.failure = "failed on another rank";
}

// The f32 baseline errors of a row: the float32 recurrence's (the oracle backend in float32), or the
// backend's own in one process when larger (sweep_run.h); a backend missing the rule alone is
// reported as a NOTE. The oracle's own algorithm is its baseline already.
std::vector<double> row_baseline(Comm& comm, BackendSlot& b, const Backend& oracle, const val::CaseData& c,
                                 const SweepReference& ref, const std::string& id, Tally& tally) {
  std::vector<double> base = ref.base_err;
  if (b.backend->name() == oracle.name() || !b.backend->supports(c.problem(DType::f32))) return base;
  const std::vector<double> single = sweep_single_errors(*b.backend, c, ref);
  for (size_t i = 0; i < single.size(); ++i) base[i] = std::max(base[i], single[i]);
  const std::string notes = sweep_backend_notes(ref, single, b.backend->device());
  tally.notes += !notes.empty();
  if (!notes.empty() && comm.rank() == 0)
    std::printf("NOTE  %s float32 in one process misses the float32 rule (a backend issue, not CP): %s; %s\n",
                b.name.c_str(), notes.c_str(), id.c_str());
  return base;
}

// The rows of one case on one backend: float64/float32 x linear/log-depth, as the options select.
void run_backend_rows(Comm& comm, const SweepOptions& o, BackendSlot& b, const Backend& oracle, const val::CaseData& c,
                      const SweepReference& ref, const std::string& id, const SweepLayout& L, bool log_depth_only,
                      Tally& tally) {
  const std::vector<double> base = row_baseline(comm, b, oracle, c, ref, id, tally);
  for (DType dt : {DType::f64, DType::f32})
    for (MergeAlgorithm m : {MergeAlgorithm::linear, MergeAlgorithm::log_depth}) {
      if (o.precision != "both" && o.precision != (dt == DType::f64 ? "f64" : "f32")) continue;
      if (o.merge != "both" && o.merge != merge_name(m)) continue;
      if (o.merge == "both" && o.quick && log_depth_only != (m == MergeAlgorithm::log_depth)) continue;
      const std::string what = b.name + " " + std::string(dtype_name(dt)) + " " + std::string(merge_name(m)) + " " + id;
      if (const Support sup = b.backend->supports(c.problem(dt)); !sup) {
        if (comm.rank() == 0) std::printf("SKIP  %s: %s\n", what.c_str(), sup.reason.c_str());
        ++tally.skipped;
        continue;
      }
      RowVerdict v = sweep_cp_row(b.data.get(), *b.backend, c, ref, base, L, m, dt);
      reduce_verdict(comm, v);
      tally.add(v, dt);
      print_row(comm.rank(), v, what);
    }
}

// The case sizes a backend's rows use: the small default (chunk 16, K = V = 8 or 16), or, for a
// backend that rejects it (cuda-chunkwise: chunk 64, K in {32, 64, 128}), chunk 64 and K = V = 32.
// The layout unit is a chunk plus an odd remainder, so rank cuts are not chunk-aligned.
struct Geometry {
  int64_t K, V, C, unit;
  bool operator==(const Geometry&) const = default;
};

Geometry geometry_for(const Backend& be, bool quick) {
  const Geometry small{quick ? 8 : 16, quick ? 8 : 16, 16, quick ? 21 : 37};
  val::CaseSpec s;
  s.K = small.K, s.V = small.V, s.chunk_size = small.C, s.T = 5;
  if (be.supports(val::make_case(s).problem(DType::f32))) return small;
  return {32, 32, 64, quick ? 69 : 133};
}

// The attention matrix for the backends that share one geometry: the oracle runs once per case.
void run_attention_group(Comm& comm, const SweepOptions& o, const Geometry& geo, std::vector<BackendSlot*>& backends,
                         Backend& oracle, Tally& tally) {
  const std::vector<SweepLayout> layouts = sweep_layouts(comm.size(), geo.unit);
  int index = 0, group = -1;  // group: (variant, flag set)
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (const SweepFlags& fs : sweep_flag_sets(var))
      for (size_t l = (++group, 0); l < layouts.size(); ++l)
        for (int states = 0; states < 2; ++states, ++index) {
          const SweepLayout& L = layouts[l];
          // quick: one of the two state settings and one merge per case, alternating so that every
          // layout meets all four combinations across the flag sets
          const bool log_depth_only = (int(l) + group / 2) % 2;
          if (o.quick && (int(l) + group + states) % 2) continue;
          val::CaseSpec s;
          s.variant = var, s.H = 1, s.HV = 2, s.K = geo.K, s.V = geo.V, s.chunk_size = geo.C;
          s.seqlens = L.seqlens, s.flags = fs.flags, s.A_log = fs.A_log, s.dt_bias = fs.dt_bias;
          s.initial_state = s.final_state = states == 0;
          s.seed = o.seed + uint64_t(index);
          const std::string id = s.name() + " " + fs.name + " " + L.describe();
          if (!o.filter.empty() && id.find(o.filter) == std::string::npos) continue;
          const val::CaseData c = val::make_case(s);
          const SweepReference ref = sweep_reference(c, oracle);
          for (BackendSlot* b : backends) run_backend_rows(comm, o, *b, oracle, c, ref, id, L, log_depth_only, tally);
        }
}

// The backends grouped by geometry(backend) (a value with ==), in the order they first appear.
template <class F>
auto group_backends(std::vector<BackendSlot>& backends, F geometry) {
  using G = decltype(geometry(*backends.front().backend));
  std::vector<std::pair<G, std::vector<BackendSlot*>>> groups;
  for (BackendSlot& b : backends) {
    const G g = geometry(*b.backend);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == g; });
    if (it == groups.end()) groups.push_back({g, {&b}});
    else it->second.push_back(&b);
  }
  return groups;
}

void run_attention(Comm& comm, const SweepOptions& o, std::vector<BackendSlot>& backends, Tally& tally) {
  auto oracle = val::backend_create("cpu-recurrent");
  auto groups = group_backends(backends, [&](const Backend& be) { return geometry_for(be, o.quick); });
  for (auto& [geo, members] : groups) run_attention_group(comm, o, geo, members, *oracle, tally);
}

void run_conv(Comm& comm, const SweepOptions& o, std::vector<BackendSlot>& backends, Tally& tally) {
  int index = 0;
  for (const SweepLayout& L : sweep_layouts(comm.size(), o.quick ? 21 : 37))
    for (int64_t W : {2, 3, 4})
      for (bool silu_bias : {true, false}) {
        if (++index, o.quick && index % 2 == 0) continue;  // quick: every other case
        const std::string id = "conv1d(W=" + std::to_string(W) + (silu_bias ? ",silu,bias" : ",identity") + ") " +
                               L.describe();
        if (!o.filter.empty() && id.find(o.filter) == std::string::npos) continue;
        for (BackendSlot& b : backends)
          for (DType dt : {DType::f64, DType::f32}) {
            if (o.precision != "both" && o.precision != (dt == DType::f64 ? "f64" : "f32")) continue;
            RowVerdict v = sweep_conv_row(b.data.get(), *b.backend, L, W, silu_bias, dt, o.seed + uint64_t(index));
            reduce_verdict(comm, v);
            tally.add(v, dt);
            print_row(comm.rank(), v, b.name + " " + std::string(dtype_name(dt)) + " " + id);
          }
      }
}

// The rows of one layer case on one backend, float64 and float32 as the options select. A precision
// the backend's kernel rejects (cuda-chunkwise: float64) is a SKIP with its reason, as for the kernel
// rows; the float32 baseline includes the backend's own layer in one process (cp_sweep_layer.h).
void run_layer_rows(Comm& comm, const SweepOptions& o, BackendSlot& b, const LayerReference& ref,
                    const std::string& id, Tally& tally) {
  for (DType dt : {DType::f64, DType::f32}) {
    if (o.precision != "both" && o.precision != (dt == DType::f64 ? "f64" : "f32")) continue;
    const std::string what = b.name + " " + std::string(dtype_name(dt)) + " " + id;
    Problem p = ref.kernel;
    p.compute = dt;
    Support sup = b.backend->supports(p);
    if (sup) sup = b.backend->supports_backward(p);
    if (!sup) {
      if (comm.rank() == 0) std::printf("SKIP  %s: %s\n", what.c_str(), sup.reason.c_str());
      ++tally.skipped;
      continue;
    }
    LayerBaseline base;
    if (dt == DType::f32) base = layer_baseline(*b.backend, ref);
    tally.notes += !base.notes.empty();
    if (!base.notes.empty() && comm.rank() == 0)
      std::printf("NOTE  %s float32 layer in one process misses the float32 rule (a backend issue, not CP): %s; %s\n",
                  b.name.c_str(), base.notes.c_str(), id.c_str());
    RowVerdict v = sweep_layer_row(b.data.get(), *b.backend, ref, base.base, dt);
    reduce_verdict(comm, v);
    tally.add(v, dt);
    print_row(comm.rank(), v, what);
  }
}

// The whole layer (conv halo + kernel transitions) on every backend, over every layout (empty ranks
// included); backends that share a layer geometry share the single-process references.
void run_layer(Comm& comm, const SweepOptions& o, std::vector<BackendSlot>& backends, Tally& tally) {
  const auto groups = group_backends(backends, [&](const Backend& be) { return layer_geometry_for(be, o.quick); });
  for (const auto& [geo, members] : groups) {
    int index = 0;
    for (const SweepLayout& L : sweep_layouts(comm.size(), geo.unit))
      for (const val::LayerCase& lc : layer_cp_cases(o.seed + uint64_t(index), geo)) {
        if (++index, o.quick && index % 2 == 0) continue;
        const std::string id = "layer " + lc.tag + "(K=" + std::to_string(geo.K) + ",C=" + std::to_string(geo.C) +
                               ") " + L.describe();
        if (!o.filter.empty() && id.find(o.filter) == std::string::npos) continue;
        const LayerReference ref = layer_reference(lc, L, comm.size());
        for (BackendSlot* b : members) run_layer_rows(comm, o, *b, ref, id, tally);
      }
  }
}

int sweep(Comm& comm, const SweepOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  Tally tally;
  if (comm.rank() == 0)
    std::printf("cp-sweep: %d ranks, seed %llu, %s; bars (validation/tolerance.h): float64 rel_l2 <= %g, float32 "
                "rel_l2 <= %g x float32 baseline + %g x cond (cond > 1 only for dg, dA_log, ddt_bias: validation/float_rule.h; "
                "kernels on the CUDA device, 3xTF32: + %g x cond; layer rows: + %g x cond)\n",
                comm.size(), static_cast<unsigned long long>(o.seed), o.quick ? "quick" : "full", val::tol::kExactF64,
                val::tol::kFloatRuleFactor, val::tol::kFloatRuleFloor,
                val::tol::kSplitTf32FloorFactor * val::tol::kFloatRuleFloor, val::tol::kLayerFloatRuleFloor);
  std::vector<BackendSlot> backends = open_backends(comm, o, tally);
  for (const BackendSlot& b : backends)
    if (comm.rank() == 0)
      std::printf("backend %s on %s, communicator %s\n", b.name.c_str(), b.backend->queue().describe().c_str(),
                  std::string(b.data.get().name()).c_str());
  run_attention(comm, o, backends, tally);
  run_conv(comm, o, backends, tally);
  run_layer(comm, o, backends, tally);
  int32_t failed = tally.failed;
  all_reduce_max(comm, &failed, 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() == 0)
    std::printf("cp-sweep: %s  P=%d  %d rows: %d passed, %d failed, %d skipped; worst err/bar float64 %.2g, "
                "float32 %.2g; %d backend notes; %.1f s\n",
                failed ? "FAILED" : "PASSED", comm.size(), tally.rows, tally.rows - tally.failed, tally.failed,
                tally.skipped, tally.worst_f64, tally.worst_f32, tally.notes, secs);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace kcp::app

namespace kcp::app {

int cmd_cp_sweep(int argc, char** argv) {
  return cp::run_mpi_command("kcp cp-sweep", [&](cp::Comm& comm) {
    Args a(argc, argv, {"backend", "seed", "filter", "merge", "precision", "comm", "timeout"}, {"quick"}, "cp-sweep");
    SweepOptions o;
    o.quick = a.has("quick");
    o.backend = a.get("backend", "all");
    o.seed = uint64_t(a.get_int("seed", 0));
    o.filter = a.get("filter", "");
    o.merge = a.get("merge", "both");
    o.precision = a.get("precision", "both");
    o.comm = comm_kind_parse(a.get("comm", "auto"));
    if (a.has("timeout")) set_comm_timeout(double(a.get_int("timeout", 600)));
    KCP_CHECK(o.merge == "both" || o.merge == "linear" || o.merge == "log-depth",
              "--merge: expected linear, log-depth or both, got '", o.merge, "'");
    KCP_CHECK(o.precision == "both" || o.precision == "f64" || o.precision == "f32",
              "--precision: expected f64, f32 or both, got '", o.precision, "'");
    return sweep(comm, o);
  });
}

}  // namespace kcp::app
