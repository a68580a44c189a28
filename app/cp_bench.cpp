// kcp cp-bench: where the time of a context-parallel call goes, per rank count. For each P in
// --ranks, the first P ranks of the job run the CP forward and backward of one problem (default:
// gdn, one sequence of T = 65536 tokens, H = HV = 4, K = V = 128, float32, backend cpu-chunkwise,
// falling back to cpu-recurrent while cpu-chunkwise is not built) while the others wait. Each phase
// (config check, transition, wait for the slowest rank, exchange, merge, local pass, parameter
// all-reduce) is reported as its maximum over the P ranks. P = 1 is the single-process call.
//   mpirun -np 4 --oversubscribe build/kcp cp-bench [--T 65536] [--H 4] [--K 128] [--V 128]
//          [--variant gdn] [--backend NAME] [--precision f32|f64] [--ranks 1,2,4] [--seqs 1] [--merge linear]
//          [--chunk 64] [--repeat 1] [--keep-denormals]
// A benchmark, never a test: figures go to docs/CP.md with date, machine and commit.
#include <omp.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <cstdio>
#include <sstream>

#include "cp/comm_mpi.h"
#include "cp/context_parallel.h"
#include "validation/cases.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "validation/registry.h"

namespace kcp::app {
using namespace kcp::val;
using namespace kcp::cp;
namespace {

// float32 transitions multiply hundreds of decays: entries of M fall below 1e-38 and x86 computes
// on such denormals about 15x slower (cpu-recurrent's float32 transition of 2048 tokens: 4.1 s
// instead of 0.29 s). GPUs, and FLA's Triton kernels, flush them to zero; so does the bench unless
// --keep-denormals. Threads created later inherit the mode (POSIX), the running pool is set here.
void flush_denormals() {
#if defined(__SSE2__)
  auto set = [] { _mm_setcsr(_mm_getcsr() | 0x8040u); };  // FTZ (bit 15) and DAZ (bit 6)
  set();
#pragma omp parallel
  set();
#endif
}

struct BenchData {  // the global problem in float32 (inputs as passed, cotangent do)
  val::CaseSpec spec;
  std::vector<int64_t> cu;
  Tensor<float> q, k, v, g, beta, d_o;
};

Tensor<float> narrow(const Tensor<double>& t) {
  if (t.empty()) return {};
  Tensor<float> f(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) f.data()[i] = float(t.data()[i]);
  return f;
}

// Ranks generate one after another so that only one float64 copy exists at a time.
BenchData make_data(Comm& world, const val::CaseSpec& s) {
  BenchData d;
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      const val::CaseData c = val::make_case(s);
      d = {c.spec, c.cu_seqlens, narrow(c.q), narrow(c.k), narrow(c.v), narrow(c.g), narrow(c.beta), narrow(c.d_o)};
    }
    world.barrier();
  }
  return d;
}

struct Row {  // all doubles, reduced as one array
  CpPhaseTimes fwd, bwd;
  double fwd_total = 0, bwd_total = 0;  // max over ranks of each rank's own total
};
static_assert(sizeof(Row) == 16 * sizeof(double));

Row run_cp_once(Comm& comm, Backend& be, const BenchData& d, DType dt, MergeAlgorithm merge) {
  ProblemOptions po;
  po.chunk_size = d.spec.chunk_size, po.compute = dt, po.cu_seqlens = d.cu, po.check_finite = false;
  ContextParallel cp(comm, be, d.spec.variant, d.spec.flags, {po, {}, merge, true});
  const int64_t lo = cp.context().lo, n = cp.context().tokens();
  Inputs in{d.q.view().narrow(1, lo, n), d.k.view().narrow(1, lo, n), d.v.view().narrow(1, lo, n),
            d.g.view().narrow(1, lo, n), d.beta.view().narrow(1, lo, n), {}, {}, {}};
  const int64_t H = d.spec.H, HV = d.spec.HV, K = d.spec.K, V = d.spec.V;
  Tensor<float> o({1, n, HV, V}), dq({1, n, H, K}), dk({1, n, H, K}), dv({1, n, HV, V});
  Tensor<float> dg(d.g.shape().size() == 4 ? Shape{1, n, HV, K} : Shape{1, n, HV});
  Tensor<float> dbeta = d.beta.empty() ? Tensor<float>() : Tensor<float>({1, n, HV});
  comm.barrier();
  cp.forward(in, {o.view(), {}});
  cp.backward(in, {d.d_o.view().narrow(1, lo, n), {}},
              {dq.view(), dk.view(), dv.view(), dg.view(), dbeta.view(), {}, {}, {}});
  Row r{cp.forward_times(), cp.backward_times(), cp.forward_times().total(), cp.backward_times().total()};
  all_reduce_max(comm, reinterpret_cast<double*>(&r), int64_t(sizeof(Row) / sizeof(double)));
  return r;
}

// The repeat with the smallest forward+backward time (the machine is shared: the minimum is the
// figure least disturbed by other work).
Row run_cp(Comm& comm, Backend& be, const BenchData& d, DType dt, MergeAlgorithm merge, int repeat) {
  Row best;
  for (int i = 0; i < repeat; ++i) {
    const Row r = run_cp_once(comm, be, d, dt, merge);
    if (i == 0 || r.fwd_total + r.bwd_total < best.fwd_total + best.bwd_total) best = r;
  }
  return best;
}

std::vector<int> parse_ranks(const std::string& s, int world) {
  std::vector<int> out;
  if (s.empty()) {
    for (int p = 1; p < world; p *= 2) out.push_back(p);
    out.push_back(world);
    return out;
  }
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const int p = std::stoi(item);
    KCP_CHECK(p >= 1 && p <= world, "--ranks: ", p, " outside [1, ", world, "] (the job's size)");
    out.push_back(p);
  }
  return out;
}

void print_row(int P, int threads, const Row& r) {
  std::printf("%3d %4d | %7.3f %7.3f %7.4f %7.4f %7.3f %7.3f | %7.3f %7.3f %7.4f %7.4f %7.3f %7.4f %7.3f | %7.3f\n", P,
              threads, r.fwd.transition, r.fwd.wait, r.fwd.exchange, r.fwd.merge, r.fwd.local, r.fwd_total,
              r.bwd.transition, r.bwd.wait, r.bwd.exchange, r.bwd.merge, r.bwd.local, r.bwd.reduce, r.bwd_total,
              r.fwd_total + r.bwd_total);
  std::fflush(stdout);
}

}  // namespace
}  // namespace kcp::app

namespace kcp::app {

int cmd_cp_bench(int argc, char** argv) {
  return cp::run_mpi_command("kcp cp-bench", [&](cp::Comm& world) {
    Args a(argc, argv, {"T", "H", "K", "V", "variant", "backend", "precision", "ranks", "seqs", "merge", "chunk", "repeat"},
           {"keep-denormals"});
    if (!a.has("keep-denormals")) flush_denormals();
    CaseSpec s;
    s.variant = variant_parse(a.get("variant", "gdn"));
    s.T = a.get_int("T", 65536), s.H = s.HV = a.get_int("H", 4), s.K = a.get_int("K", 128), s.V = a.get_int("V", 128);
    s.chunk_size = a.get_int("chunk", 64), s.seed = 1, s.initial_state = s.final_state = false;
    const int64_t nseq = a.get_int("seqs", 1);
    KCP_CHECK(nseq >= 1 && nseq <= s.T, "--seqs: expected 1 .. T, got ", nseq);
    for (int64_t i = 0; i < nseq; ++i) s.seqlens.push_back(s.T / nseq + (i < s.T % nseq ? 1 : 0));
    const DType dt = a.get("precision", "f32") == "f64" ? DType::f64 : DType::f32;
    const int repeat = int(a.get_int("repeat", 1));
    KCP_CHECK(repeat >= 1, "--repeat: expected at least 1, got ", repeat);
    const cp::MergeAlgorithm merge = cp::merge_parse(a.get("merge", "linear"));
    std::string name = a.get("backend", "cpu-chunkwise"), note;
    std::unique_ptr<Backend> be;
    try {
      be = backend_create(name);
    } catch (const std::exception& e) {
      KCP_CHECK(!a.has("backend"), "--backend ", name, ": ", e.what());
      note = " (cpu-chunkwise unavailable: " + std::string(e.what()) + "; using cpu-recurrent)";
      be = backend_create(name = "cpu-recurrent");
    }
    const std::vector<int> ranks = parse_ranks(a.get("ranks", ""), world.size());
    if (world.rank() == 0)
      std::printf("cp-bench: %s %s, backend %s%s, merge %s, %s, %d ranks in the job on %d cores; seconds, max over "
                  "ranks, best of %d (wait: load imbalance before the exchange)\n"
                  "  P  thr | fwd: trans    wait    exch   merge   local   total | bwd: trans    wait    exch   merge"
                  "   local  reduce   total | fwd+bwd\n",
                  s.name().c_str(), std::string(dtype_name(dt)).c_str(), name.c_str(), note.c_str(),
                  std::string(cp::merge_name(merge)).c_str(),
                  a.has("keep-denormals") ? "IEEE denormals" : "denormals flushed to zero", world.size(),
                  omp_get_num_procs(), repeat);
    const BenchData d = make_data(world, s);
    for (int P : ranks) {
      std::unique_ptr<cp::Comm> sub = world.split(world.rank() < P ? 0 : 1);
      if (world.rank() < P) {
        const int threads = std::max(1, omp_get_num_procs() / P);
        omp_set_num_threads(threads);
        const Row r = run_cp(*sub, *be, d, dt, merge, repeat);
        if (world.rank() == 0) print_row(P, threads, r);
      }
      world.barrier();
    }
    return 0;
  });
}

}  // namespace kcp::app
