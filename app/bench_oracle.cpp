// kcp bench-oracle: wall time of the CPU backends, forward and forward+backward, float64 and float32,
// the speedup of cpu-chunkwise over cpu-recurrent, and each algorithm's FLOP rate against the
// machine's measured GEMM peak (Eigen, every thread, timed in the same command).
// FLOP counts are each algorithm's own operation count (below), so rates compare efficiency and
// times compare algorithms. The backends (and, for gdn, the chunkwise products floor of
// bench_products.h) run interleaved round by round on inputs held in the measured precision; the
// speedup is printed best-of-rounds and as the median of per-round ratios (a shared VM's load moves
// between rounds). A benchmark, never a test: figures go to docs/ with date, machine, commit.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "reference/chunkwise.h"
#include "app/bench_products.h"
#include "validation/cases.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "validation/registry.h"

namespace kcp::app {
using namespace kcp::val;
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

struct Time {
  double wall = 0, cpu = 0;  // seconds; cpu = summed over threads
};

// The fastest of `repeat` runs (wall time, and the CPU time of that run): on a machine shared with
// other work, contention only ever adds time, so the best run is the closest to the machine's speed.
template <class F>
Time best_time(int repeat, F&& f) {
  Time best{1e300, 0};
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    f();
    const Time t{seconds_since(t0), process_cpu_seconds() - c0};
    if (t.wall < best.wall) best = t;
  }
  return best;
}

// Machine peak: every thread multiplies its own N x N matrices (Eigen GEMM, single-threaded each,
// N = 256 so that they stay in cache), best of `repeat`, with this build's instruction set.
template <class S>
double gemm_peak_gflops(int64_t N, int repeat) {
  using M = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  const int threads = omp_get_max_threads(), iters = 40;
  const double t = best_time(repeat, [&] {
#pragma omp parallel
    {
      M a = M::Ones(N, N), b = M::Ones(N, N), c(N, N);
      for (int i = 0; i < iters; ++i) c.noalias() = a * b;
    }
  }).wall;
  return 2.0 * double(N * N * N) * iters * threads / t * 1e-9;
}

struct Timing {
  Time fwd, fwd_bwd;
};

// An absent (empty) tensor stays absent.
template <class S>
Tensor<S> cast_tensor(const Tensor<double>& t) {
  return t.empty() ? Tensor<S>() : to_tensor<S>(t.view());
}

// The case's tensors held in S, as a caller computing in S passes them: a float32 run reading
// float64 inputs would time a float64 -> float32 conversion of every row (memory-bound here).
template <class S>
struct CaseIn {
  Tensor<S> q, k, v, g, beta, A_log, dt_bias, h0, d_o, dht;
  explicit CaseIn(const CaseData& c)
      : q(cast_tensor<S>(c.q)), k(cast_tensor<S>(c.k)), v(cast_tensor<S>(c.v)), g(cast_tensor<S>(c.g)),
        beta(cast_tensor<S>(c.beta)), A_log(cast_tensor<S>(c.A_log)), dt_bias(cast_tensor<S>(c.dt_bias)),
        h0(cast_tensor<S>(c.h0)), d_o(cast_tensor<S>(c.d_o)), dht(cast_tensor<S>(c.dht)) {}
  Inputs inputs() const {
    return {q.view(), k.view(), v.view(), g.view(), beta.view(), A_log.view(), dt_bias.view(), h0.view()};
  }
  Cotangents cotangents() const { return {d_o.view(), dht.view()}; }
  int64_t numel() const {
    int64_t n = 0;
    for (const Tensor<S>* t : {&q, &k, &v, &g, &beta, &h0, &d_o, &dht}) n += t->numel();
    return n;
  }
};

// One backend at one precision, set up once and timed round after round.
template <class S>
struct Contestant {
  Backend& be;
  Problem p;
  const CaseIn<S>& in;
  OutputSet<S> out;
  GradSet<S> gr;
  Timing best{{1e300, 0}, {1e300, 0}};
  std::vector<double> fwd_bwd;  // wall time of each round
  Contestant(Backend& b, const Problem& pr, const CaseIn<S>& i)
      : be(b), p(pr), in(i), out(make_outputs<S>(pr, true)), gr(make_grads<S>(pr, i.inputs())) {}
  void round() {
    const Time f = best_time(1, [&] { be.forward(p, in.inputs(), out.views()); });
    const Time fb = best_time(1, [&] {
      be.forward(p, in.inputs(), out.views());
      be.backward(p, in.inputs(), in.cotangents(), gr.views());
    });
    if (f.wall < best.fwd.wall) best.fwd = f;
    if (fb.wall < best.fwd_bwd.wall) best.fwd_bwd = fb;
    fwd_bwd.push_back(fb.wall);
  }
};

template <class S>
void print_contestant(const Contestant<S>& c, double peak) {
  const std::string name(c.be.name()), dt(dtype_name(c.p.compute));
  const double ff = total_flops(name, c.p, false), fb = ff + total_flops(name, c.p, true), tok = double(c.p.T * c.p.B);
  const Time &f = c.best.fwd, &b = c.best.fwd_bwd;
  std::printf("%-14s %-8s fwd %7.3f s (cpu %6.3f) %8.0f tok/s %6.2f GFLOP/s %3.0f%% | fwd+bwd %7.3f s (cpu %6.3f) "
              "%8.0f tok/s %6.2f GFLOP/s %3.0f%%\n",
              name.c_str(), dt.c_str(), f.wall, f.cpu, tok / f.wall, ff / f.wall * 1e-9, 100 * ff / f.wall * 1e-9 / peak,
              b.wall, b.cpu, tok / b.wall, fb / b.wall * 1e-9, 100 * fb / b.wall * 1e-9 / peak);
}

// Median of the per-round ratios a[r] / b[r]: rounds minutes apart see different machine load,
// but the two runs of one round are adjacent, so their ratio is the steadier figure.
double median_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
  if (r.empty()) return 0;
  std::sort(r.begin(), r.end());
  return r.size() % 2 ? r[r.size() / 2] : 0.5 * (r[r.size() / 2 - 1] + r[r.size() / 2]);
}

// Every CPU backend (and, for gdn, the chunkwise products floor of bench_products.h) at precision S,
// interleaved round by round so that all see the same machine.
template <class S>
void bench_precision(const CaseData& c, const std::string& which, int repeat, double peak) {
  const DType dt = dtype_of<S>();
  const CaseIn<S> in(c);
  const Problem p = c.problem(dt);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Contestant<S>> cs;
  cs.reserve(4);
  for (const std::string& name : backend_names()) {
    if (which != "all" && which != name) continue;
    std::unique_ptr<Backend> be = backend_create(name);
    if (be->device() != Device::host) continue;  // the oracle's algorithms: host backends (bench covers GPUs)
    owned.push_back(std::move(be));
    if (const Support sup = owned.back()->supports(p); !sup) {
      std::printf("%-14s %-8s unsupported: %s\n", name.c_str(), dtype_name(dt).data(), sup.reason.c_str());
      continue;
    }
    cs.emplace_back(*owned.back(), p, in);
  }
  const CaseSpec& s = c.spec;
  // the floor runs whole chunks of the gdn product list: printed only where that is exactly the case
  const bool floor = s.variant == Variant::gdn && s.T % s.chunk_size == 0 && (which == "all" || which == "cpu-chunkwise");
  ProductsTime pt{1e300, 1e300};
  std::vector<double> floor_rounds;
  for (int r = 0; r < repeat; ++r) {
    for (Contestant<S>& x : cs) x.round();
    if (!floor) continue;
    const ProductsTime t = chunkwise_products_time<S>(s.HV, ref::chunk_count(s.T, s.chunk_size), s.chunk_size, s.K, s.V, 1);
    pt.fwd = std::min(pt.fwd, t.fwd), pt.fwd_bwd = std::min(pt.fwd_bwd, t.fwd_bwd);
    floor_rounds.push_back(t.fwd_bwd);
  }
  for (const Contestant<S>& x : cs) print_contestant(x, peak);
  std::printf("%-8s peak RSS so far %.0f MiB (this case's inputs, outputs and grads in %s: %.0f MiB, plus the "
              "float64 case they come from)\n",
              dtype_name(dt).data(), peak_rss_mib(), dtype_name(dt).data(),
              cs.empty() ? 0.0 : double(sizeof(S) * size_t(in.numel() + cs[0].out.o.numel() +
                                                            cs[0].gr.dq.numel() + cs[0].gr.dk.numel() +
                                                            cs[0].gr.dv.numel() + cs[0].gr.dg.numel())) / 1048576.0);
  if (floor)
    std::printf("cpu-chunkwise  %-8s its matrix products alone (a floor, bench_products.h): fwd %7.3f s | fwd+bwd "
                "%7.3f s\n", dtype_name(dt).data(), pt.fwd, pt.fwd_bwd);
  if (cs.size() < 2) return;
  const Contestant<S>&rec = cs[0], &chk = cs[1];
  std::printf("speedup cpu-chunkwise over cpu-recurrent, %s: fwd %.2fx (cpu time %.2fx), fwd+bwd %.2fx (cpu time "
              "%.2fx); median of the %d rounds' fwd+bwd ratios %.2fx",
              dtype_name(dt).data(), rec.best.fwd.wall / chk.best.fwd.wall, rec.best.fwd.cpu / chk.best.fwd.cpu,
              rec.best.fwd_bwd.wall / chk.best.fwd_bwd.wall, rec.best.fwd_bwd.cpu / chk.best.fwd_bwd.cpu, repeat,
              median_ratio(rec.fwd_bwd, chk.fwd_bwd));
  if (floor)
    std::printf("; cpu-recurrent over the products floor: %.2fx (median %.2fx)", rec.best.fwd_bwd.wall / pt.fwd_bwd,
                median_ratio(rec.fwd_bwd, floor_rounds));
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int cmd_bench_oracle(int argc, char** argv) {
  Args a(argc, argv, {"T", "H", "K", "V", "variant", "backend", "precision", "repeat", "chunk"}, {},
         "bench-oracle");
  CaseSpec s;
  s.variant = variant_parse(a.get("variant", "gdn"));
  s.T = a.get_int("T", 8192), s.H = s.HV = a.get_int("H", 4);
  s.K = a.get_int("K", 128), s.V = a.get_int("V", 128);
  s.chunk_size = a.get_int("chunk", 64);
  s.seed = 1;
  const int repeat = int(a.get_int("repeat", 3));
  KCP_CHECK(repeat >= 1, "--repeat: must be at least 1, got ", repeat);
  const std::string which = a.get("backend", "all"), prec = a.get("precision", "both");
  const CaseData c = make_case(s);
  std::printf("bench-oracle: %s, %d threads, best of %d\n", s.name().c_str(), omp_get_max_threads(), repeat);
  std::map<std::string, double> peak;
  if (prec == "both" || prec == "f64") peak["f64"] = gemm_peak_gflops<double>(256, repeat + 2);
  if (prec == "both" || prec == "f32") peak["f32"] = gemm_peak_gflops<float>(256, repeat + 2);
  std::printf("machine GEMM peak (Eigen, %d threads, 256^3 each):", omp_get_max_threads());
  for (const auto& [k, v] : peak) std::printf(" %s %.1f GFLOP/s", k == "f64" ? "float64" : "float32", v);
  std::printf(" (%% columns below are of this peak)\n");
  if (peak.count("f64")) bench_precision<double>(c, which, repeat, peak["f64"]);
  if (peak.count("f32")) bench_precision<float>(c, which, repeat, peak["f32"]);
  return 0;
}

}  // namespace kcp::app
