// kcp bench-oracle: wall time of the CPU backends, forward and forward+backward, float64 and float32,
// the speedup of cpu-chunkwise over cpu-recurrent, and each algorithm's FLOP rate against the
// machine's measured GEMM peak (Eigen, every thread, timed in the same command).
// FLOP counts are each algorithm's own operation count (below), so rates compare efficiency and
// times compare algorithms. A benchmark, never a test: figures go to docs/ with date, machine, commit.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <map>

#include "reference/chunkwise.h"
#include "validation/cases.h"
#include "validation/cli_args.h"
#include "validation/commands.h"
#include "validation/registry.h"

namespace kcp::val {
namespace {

// cpu-recurrent, per (token, value head), in units of K*V flops (see reference/recurrent.cpp):
// forward 7 (decay 1, k^T S 2, update 2, output 2); backward 29 (checkpoint pass 5, segment
// recompute 5, reverse step 19: pass A 9, pass B 10). (This command used to count 36.)
double recurrent_flops(bool backward, int64_t K, int64_t V) { return (backward ? 29.0 : 7.0) * double(K * V); }

// cpu-chunkwise, one chunk of L rows, flops (2 per multiply-add) of the matrix products as
// reference/chunkwise*.cpp runs them; triangular products count half, elementwise work is not counted.
//   forward:  6LKV (w h, kg^T vnew, qg h) + L^2(3K + 2V) (kkt, Aqk, P[kb|vb], Aqk vnew) + L^3/3 (solve)
//   backward: recompute 4LKV + L^2(3K + V) + L^3/3; reverse 12LKV (kg dh, qg^T do, w^T dvnew,
//             do h^T, vnew dh^T, dXu h^T) + L^2(4K + 5V) (dAqk, Aqk^T do, P^T dvnew, Lmat vnew, dP,
//             the four gram gradients) + 2L^3 (dL)
//   gla (no WY): forward 4LKV + L^2(K + V); backward 2LKV + L^2 K + 8LKV + L^2(2K + 2V).
double chunkwise_flops_chunk(bool delta, bool backward, double L, double K, double V) {
  if (!delta)
    return backward ? 10 * L * K * V + L * L * (3 * K + 2 * V) : 4 * L * K * V + L * L * (K + V);
  if (!backward) return 6 * L * K * V + L * L * (3 * K + 2 * V) + L * L * L / 3;
  return 16 * L * K * V + L * L * (7 * K + 6 * V) + 7 * L * L * L / 3;
}

double total_flops(const std::string& backend, const Problem& p, bool backward) {
  double f = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t L = p.sequence(n).len;
    if (backend == "cpu-recurrent") {
      f += double(L) * recurrent_flops(backward, p.K, p.V);
      continue;
    }
    for (int64_t c = 0; c < ref::chunk_count(L, p.chunk_size); ++c)
      f += chunkwise_flops_chunk(p.delta_rule(), backward, double(ref::chunk_span(L, p.chunk_size, c).len),
                                 double(p.K), double(p.V));
  }
  return f * double(p.HV);
}

// Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

size_t tensor_bytes(const CaseData& c) {
  size_t n = 0;
  for (const Tensor<double>* t : {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.d_o, &c.dht}) n += size_t(t->numel());
  return n * sizeof(double);
}

struct Time {
  double wall = 0, cpu = 0;  // seconds; cpu = summed over threads (robust to other load on the machine)
};

// Medians of the wall and the CPU time of `repeat` runs.
template <class F>
Time median_time(int repeat, F&& f) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    f();
    cpu.push_back(process_cpu_seconds() - c0);
    wall.push_back(seconds_since(t0));
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

// Machine peak: every thread multiplies its own N x N matrices (Eigen GEMM, single-threaded each).
template <class S>
double gemm_peak_gflops(int64_t N, int repeat) {
  using M = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  const int threads = omp_get_max_threads();
  const double t = median_time(repeat, [&] {
#pragma omp parallel
    {
      M a = M::Ones(N, N), b = M::Ones(N, N), c(N, N);
      for (int i = 0; i < 4; ++i) c.noalias() = a * b;
    }
  }).wall;
  return 2.0 * double(N * N * N) * 4 * threads / t * 1e-9;
}

struct Timing {
  Time fwd, fwd_bwd;
};

template <class S>
bool bench_one(Backend& be, const CaseData& c, DType dt, int repeat, double peak, Timing& tm) {
  const Problem p = c.problem(dt);
  const std::string name(be.name());
  if (const Support sup = be.supports(p); !sup) {
    std::printf("%-14s %-8s unsupported: %s\n", name.c_str(), std::string(dtype_name(dt)).c_str(), sup.reason.c_str());
    return false;
  }
  auto out = make_outputs<S>(p, true);
  auto gr = make_grads<S>(p, c.inputs());
  tm.fwd = median_time(repeat, [&] { be.forward(p, c.inputs(), out.views()); });
  tm.fwd_bwd = median_time(repeat, [&] {
    be.forward(p, c.inputs(), out.views());
    be.backward(p, c.inputs(), c.cotangents(), gr.views());
  });
  const double ff = total_flops(name, p, false), fb = ff + total_flops(name, p, true), tok = double(p.T * p.B);
  const double wf = tm.fwd.wall, wb = tm.fwd_bwd.wall;
  std::printf("%-14s %-8s fwd %7.3f s (cpu %6.3f) %8.0f tok/s %6.2f GFLOP/s %3.0f%% | fwd+bwd %7.3f s (cpu %6.3f) "
              "%8.0f tok/s %6.2f GFLOP/s %3.0f%%\n",
              name.c_str(), std::string(dtype_name(dt)).c_str(), wf, tm.fwd.cpu, tok / wf, ff / wf * 1e-9,
              100 * ff / wf * 1e-9 / peak, wb, tm.fwd_bwd.cpu, tok / wb, fb / wb * 1e-9, 100 * fb / wb * 1e-9 / peak);
  std::printf("%-14s %-8s peak RSS so far %.0f MiB (inputs+outputs+grads of this case: %.0f MiB)\n",
              std::string(be.name()).c_str(), std::string(dtype_name(dt)).c_str(), peak_rss_mib(),
              double(tensor_bytes(c) + sizeof(S) * size_t(out.o.numel() + gr.dq.numel() + gr.dk.numel() + gr.dv.numel() + gr.dg.numel())) / 1048576.0);
  std::fflush(stdout);
  return true;
}

}  // namespace

int cmd_bench_oracle(int argc, char** argv) {
  Args a(argc, argv, {"T", "H", "K", "V", "variant", "backend", "precision", "repeat", "chunk"}, {});
  CaseSpec s;
  s.variant = variant_parse(a.get("variant", "gdn"));
  s.T = a.get_int("T", 8192), s.H = s.HV = a.get_int("H", 4);
  s.K = a.get_int("K", 128), s.V = a.get_int("V", 128);
  s.chunk_size = a.get_int("chunk", 64);
  s.seed = 1;
  const int repeat = int(a.get_int("repeat", 3));
  const std::string which = a.get("backend", "all"), prec = a.get("precision", "both");
  const CaseData c = make_case(s);
  std::printf("bench-oracle: %s, %d threads, median of %d\n", s.name().c_str(), omp_get_max_threads(), repeat);
  std::map<std::string, double> peak;
  if (prec == "both" || prec == "f64") peak["f64"] = gemm_peak_gflops<double>(512, repeat);
  if (prec == "both" || prec == "f32") peak["f32"] = gemm_peak_gflops<float>(512, repeat);
  std::printf("machine GEMM peak (Eigen, %d threads, 512^3 each):", omp_get_max_threads());
  for (const auto& [k, v] : peak) std::printf(" %s %.1f GFLOP/s", k == "f64" ? "float64" : "float32", v);
  std::printf(" (%% columns below are of this peak)\n");
  std::map<std::string, Timing> times;  // "backend/dtype"
  for (const std::string& name : backend_names()) {
    if (which != "all" && which != name) continue;
    if (name.rfind("cpu-", 0) != 0) continue;
    auto be = backend_create(name);
    if (peak.count("f64")) bench_one<double>(*be, c, DType::f64, repeat, peak["f64"], times[name + "/f64"]);
    if (peak.count("f32")) bench_one<float>(*be, c, DType::f32, repeat, peak["f32"], times[name + "/f32"]);
  }
  for (const char* dt : {"f64", "f32"}) {
    const std::string r = std::string("cpu-recurrent/") + dt, k = std::string("cpu-chunkwise/") + dt;
    if (!times.count(r) || !times.count(k) || times[k].fwd.wall == 0 || times[r].fwd.wall == 0) continue;
    const Timing &R = times[r], &Kt = times[k];
    std::printf("speedup cpu-chunkwise over cpu-recurrent, %s: fwd %.2fx (cpu time %.2fx), fwd+bwd %.2fx (cpu time %.2fx)\n",
                std::string(dt) == "f64" ? "float64" : "float32", R.fwd.wall / Kt.fwd.wall, R.fwd.cpu / Kt.fwd.cpu,
                R.fwd_bwd.wall / Kt.fwd_bwd.wall, R.fwd_bwd.cpu / Kt.fwd_bwd.cpu);
  }
  return 0;
}

}  // namespace kcp::val
