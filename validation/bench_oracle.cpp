// kcp bench-oracle: wall time of the CPU backends, forward and forward+backward, float64 and float32.
// Prints tokens/s and the FLOP rate of the algorithm's own operation count (flops_per_token_head).
// A benchmark, never a test: figures go to docs/BENCHMARKS.md with date, machine and commit.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "validation/cases.h"
#include "validation/cli_args.h"
#include "validation/commands.h"
#include "validation/registry.h"

namespace kcp::val {
namespace {

// Multiply-add count per (token, value head) of one pass, in units of K*V (see reference/recurrent.cpp):
// forward 7 (decay 1, k^T S 2, update 2, output 2); backward 29 (checkpoint pass 5, segment recompute
// 5, reverse step 19). cpu-chunkwise reports the same algorithmic count so rates are comparable.
double flops_per_token_head(bool backward, int64_t K, int64_t V) { return (backward ? 36.0 : 7.0) * double(K * V); }

// Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double median_time(int repeat, F&& f) {
  std::vector<double> ts;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ts.push_back(seconds_since(t0));
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

size_t tensor_bytes(const CaseData& c) {
  size_t n = 0;
  for (const Tensor<double>* t : {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.d_o, &c.dht}) n += size_t(t->numel());
  return n * sizeof(double);
}

template <class S>
void bench_one(Backend& be, const CaseData& c, DType dt, int repeat) {
  const Problem p = c.problem(dt);
  if (!be.supports(p)) {
    std::printf("%-14s %-8s unsupported: %s\n", std::string(be.name()).c_str(), std::string(dtype_name(dt)).c_str(),
                be.supports(p).reason.c_str());
    return;
  }
  auto out = make_outputs<S>(p, true);
  auto gr = make_grads<S>(p, c.inputs());
  const double tf = median_time(repeat, [&] { be.forward(p, c.inputs(), out.views()); });
  const double tb = median_time(repeat, [&] {
    be.forward(p, c.inputs(), out.views());
    be.backward(p, c.inputs(), c.cotangents(), gr.views());
  });
  const double th = double(p.T * p.B * p.HV);
  std::printf("%-14s %-8s fwd %8.3f s %10.0f tok/s %6.2f GFLOP/s | fwd+bwd %8.3f s %10.0f tok/s %6.2f GFLOP/s\n",
              std::string(be.name()).c_str(), std::string(dtype_name(dt)).c_str(), tf, double(p.T * p.B) / tf,
              th * flops_per_token_head(false, p.K, p.V) / tf * 1e-9, tb, double(p.T * p.B) / tb,
              th * (flops_per_token_head(false, p.K, p.V) + flops_per_token_head(true, p.K, p.V)) / tb * 1e-9);
  std::printf("%-14s %-8s peak RSS so far %.0f MiB (inputs+outputs+grads of this case: %.0f MiB)\n",
              std::string(be.name()).c_str(), std::string(dtype_name(dt)).c_str(), peak_rss_mib(),
              double(tensor_bytes(c) + sizeof(S) * size_t(out.o.numel() + gr.dq.numel() + gr.dk.numel() + gr.dv.numel() + gr.dg.numel())) / 1048576.0);
  std::fflush(stdout);
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
  const int repeat = int(a.get_int("repeat", 1));
  const std::string which = a.get("backend", "all"), prec = a.get("precision", "both");
  const CaseData c = make_case(s);
  std::printf("bench-oracle: %s, %d threads, median of %d\n", s.name().c_str(), omp_get_max_threads(), repeat);
  for (const std::string& name : backend_names()) {
    if (which != "all" && which != name) continue;
    if (name.rfind("cpu-", 0) != 0) continue;
    auto be = backend_create(name);
    if (prec == "both" || prec == "f64") bench_one<double>(*be, c, DType::f64, repeat);
    if (prec == "both" || prec == "f32") bench_one<float>(*be, c, DType::f32, repeat);
  }
  return 0;
}

}  // namespace kcp::val
