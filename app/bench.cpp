// kcp bench: forward time of one backend on its own device (a GPU backend: CUDA events), for the
// issue's shapes: B = 1, T in {8192, 32768}, H = HV in {16, 32}, K = V = 128, bf16 q/k/v, float32
// gates and beta, gdn and kda, no initial or final state. Warm-up runs, then the median of many
// timed runs, rotating over several input sets (distinct data) so the 50 MB L2 cannot serve them.
// Printed per shape: median and min ms; achieved bytes/s (the minimum bytes: each input read once,
// o written once); FLOP/s of the operations the chunkwise algorithm executes (FLA-style count,
// docs/BENCHMARKS.md "GPU"); the H100 lower bound LB = max(fused FLOPs / 800 TF/s, bytes / 3.0 TB/s) and
// LB / time; FLA's Triton time measured on the same H100 where docs/BENCHMARKS.md has it.
// --backward 1: forward + backward per timed run (gradients in FLA's dtypes: dq, dk, dv in the input
// dtype, dg and dbeta float32), printed as median and min ms; FLA's forward+backward from the issue's
// measurement (same H100, FLA bc3b101d) where known; scripts/bench_backward.sh times FLA in the same call.
// --seqs N: the T tokens as N packed sequences of (nearly) equal length (cu_seqlens), e.g. 16 x 2048.
// --segment auto|off|<tokens>: the intra-card CP plan (segment/plan.h) of the forward, and of the
// backward when the length is forced (default: the backend's, i.e. KCP_CUDA_SEGMENT or automatic for
// cuda-chunkwise, none for host backends);
// --transitions 1: instead, the CP transitions of the whole input as one rank's part (transition_forward:
// S_ext and M; transition_backward: dS_ext and M^T), median ms of each, gated against cpu-chunkwise's.
// --cp-rank first|middle|last: instead, one CP rank's calls without the exchange (bench_cp_rank): its
// transitions or prepares and its local passes, median ms of the forward part and of both.
// --explain: each row ends with the plan the forward ran (Backend::explain_forward) and the kernels
// its last forward picked (Backend::explain_last_forward: cuda-chunkwise's state kernel, kda's windows).
// --keep 1|0 (cuda-chunkwise): the forward keeps its intermediates for the backward that follows
// (BackendOptions::keep_forward; default KCP_CUDA_KEEP, else 0: every backward recomputes them).
// --fused 1 (gdn, kda): the input transforms in the kernel (L2 norm of q, k, beta sigmoid, the softplus
// gate with A_log and dt_bias: Kimi Linear's KDA call; bench_inputs.h), with dA_log and ddt_bias; no
// FLA figure is printed for these rows (the recorded ones are for plain gates).
// Every row is first run on input set 0 and judged against the float64 oracle (bench_check.h); a
// row that fails prints WRONG and the failing tensor instead of times (--check 0 skips the gate and
// says "unchecked"). MiB held: device memory the row holds (inputs, outputs, gradients, workspaces).
// A benchmark, never a test: figures go to docs/CUDA.md with date, device and commit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "app/bench_check.h"
#include "app/bench_inputs.h"
#include "app/cli_args.h"
#include "app/commands.h"
#include "core/transition.h"
#include "segment/plan.h"
#include "validation/registry.h"

namespace kcp::app {
using namespace kcp::val;
namespace {

std::vector<long long> int_list(const std::string& s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoll(x));
  return v;
}
std::vector<std::string> str_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
  return v;
}

// FLA's Triton forward+backward on the same H100 (issue 11, FLA bc3b101d, bf16, K = V = 128).
// The recorded FLA figures are for one sequence, K = V = 128, bf16 q/k/v: other rows print none.
bool fla_shape(const Problem& p, DType qkv) {
  return p.N == 1 && p.K == 128 && p.V == 128 && qkv == DType::bf16 && !p.flags.use_gate_in_kernel;  // not --fused
}

double fla_fwd_bwd_ms(Variant var, int64_t T, int64_t H) {
  if (H != 16) return 0;
  if (var == Variant::gdn) return T == 8192 ? 2.61 : T == 32768 ? 5.27 : 0;
  if (var == Variant::gla) return 0;  // not measured then: scripts/gpu_bwd_check.sh times chunk_gla in the same call
  return T == 8192 ? 5.13 : 0;
}

// Gradient buffers of one forward+backward (FLA's dtypes).
struct BwdBuffers {
  std::vector<DeviceBuffer> bufs;
  Grads g;
};
BwdBuffers make_bwd_buffers(Backend& be, const Problem& p, DType dt) {
  const Variant var = p.variant;
  const int64_t T = p.T, H = p.H, K = p.K, V = p.V;
  BwdBuffers b;
  b.bufs.reserve(7);
  auto put = [&](DType t, Shape sh) {
    b.bufs.emplace_back(be.queue(), size_t(shape_numel(sh)) * size_t(dtype_size(t)));
    return TensorView(b.bufs.back().get(), t, std::move(sh), be.device());
  };
  b.g.dq = put(dt, {1, T, H, K}), b.g.dk = put(dt, {1, T, H, K}), b.g.dv = put(dt, {1, T, H, V});
  b.g.dg = put(DType::f32, var == Variant::gdn ? Shape{1, T, H} : Shape{1, T, H, K});
  if (var != Variant::gla) b.g.dbeta = put(DType::f32, {1, T, H});  // gla has no beta
  if (p.flags.use_gate_in_kernel)  // --fused: the gate parameters' gradients, float32
    b.g.dA_log = put(DType::f32, {p.HV}), b.g.ddt_bias = put(DType::f32, shape_dt_bias(p));
  return b;
}

// FLA's Triton forward on the same H100 (docs/BENCHMARKS.md "GPU"), gdn only.
double fla_ms(Variant var, int64_t T, int64_t H) {
  if (var != Variant::gdn) return 0;
  if (T == 8192 && H == 16) return 0.500;
  if (T == 32768 && H == 16) return 1.399;
  if (T == 32768 && H == 32) return 2.202;
  return 0;
}

struct Row {
  std::string text;
};

// Per row: the correctness gate (bench_check.h) and the device memory in use before the row's
// buffers, so that `memory_mib` is what the row holds: inputs, outputs, gradients and the backend's
// workspaces (it keeps them between calls and frees nothing inside one, so held = peak). The backend
// is created per row so that no workspace of an earlier row is counted.
struct Gate {
  bool check = true;
  BenchShape shape;
  uint64_t seed = 1000;  // input set 0
  int64_t used_before = -1;
  BenchVerdict run(Backend& be, const Problem& p, const TensorView& o, const Grads& g) const {
    if (!check) return {true, "unchecked (--check 0)"};
    return check_bench_row(be, shape, p, seed, o, g);
  }
  double memory_mib(Backend& be) const {
    const int64_t now = be.queue().device_memory_used();
    return used_before < 0 || now < 0 ? -1 : double(now - used_before) / double(1 << 20);
  }
};

// Forward+backward: median and min ms against FLA's.
Row bench_backward(Backend& be, const Problem& p, std::vector<BenchInputs>& in, const Outputs& out, int warmup,
                   int repeat, std::string prefix, const Gate& gate) {
  if (Support sup = be.supports_backward(p); !sup) return {prefix + "unsupported: " + sup.reason + " |"};
  BwdBuffers gb = make_bwd_buffers(be, p, in[0].in.q.dtype);
  const size_t sets = in.size();
  auto run = [&](int i) {
    const BenchInputs& x = in[size_t(i) % sets];
    be.forward(p, x.in, out);
    be.backward(p, x.in, {x.d_o, {}}, gb.g);
  };
  run(0);  // set 0, judged before anything is timed
  const BenchVerdict v = gate.run(be, p, out.o, gb.g);
  if (!v.ok) return {prefix + v.text + " |"};
  for (int i = 0; i < warmup; ++i) run(i);
  be.synchronize();
  const double mib = gate.memory_mib(be);
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) ms.push_back(be.queue().time_ms([&] { run(i); }));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2], fla = fla_shape(p, in[0].in.q.dtype) ? fla_fwd_bwd_ms(p.variant, p.T, p.H) : 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f | %.3f | - | - | - | - | %s | %s | %s | %s |", med, ms.front(),
                fla > 0 ? detail::concat(fla).c_str() : "-",
                fla > 0 ? detail::concat(int(std::lround(100 * fla / med)), "%").c_str() : "-",
                mib >= 0 ? detail::concat(std::lround(mib)).c_str() : "-", v.text.c_str());
  return {prefix + buf};
}

// The CP transitions of the whole input as one rank's part (--transitions 1): transition_forward
// (S_ext, M) and transition_backward (dS_ext, M^T), median ms of each, gated like the other rows.
Row bench_transitions(Backend& be, const Problem& p, std::vector<BenchInputs>& in, int warmup, int repeat,
                      std::string prefix, const Gate& gate) {
  if (Support sup = be.supports_backward(p); !sup) return {prefix + "unsupported: " + sup.reason + " |"};
  const Shape shape = transition_shape(p.N, p.HV, p.K, p.V);
  const size_t bytes = sizeof(float) * size_t(shape_numel(shape));
  DeviceBuffer fb(be.queue(), bytes), bb(be.queue(), bytes);
  const TensorView fwd(fb.get(), DType::f32, shape, be.device()), bwd(bb.get(), DType::f32, shape, be.device());
  const size_t sets = in.size();
  auto tf = [&](int i) { be.transition_forward(p, in[size_t(i) % sets].in, 0, fwd); };
  auto tb = [&](int i) { be.transition_backward(p, in[size_t(i) % sets].in, in[size_t(i) % sets].d_o, 0, bwd); };
  tf(0), tb(0);  // set 0, judged before anything is timed
  const BenchVerdict v = gate.check ? check_bench_transitions(be, gate.shape, p, gate.seed, fwd, bwd)
                                    : BenchVerdict{true, "unchecked (--check 0)"};
  if (!v.ok) return {prefix + v.text + " |"};
  for (int i = 0; i < warmup; ++i) tf(i), tb(i);
  be.synchronize();
  std::vector<double> f, b;
  for (int i = 0; i < repeat; ++i) {
    f.push_back(be.queue().time_ms([&] { tf(i); }));
    b.push_back(be.queue().time_ms([&] { tb(i); }));
  }
  std::sort(f.begin(), f.end()), std::sort(b.begin(), b.end());
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3f | %.3f | ", f[f.size() / 2], b[b.size() / 2]);
  return {prefix + buf + v.text + " |"};
}

// One CP rank's calls on this device without the exchange (--cp-rank first|middle|last), in the order
// cp/context_parallel.cpp makes them: forward: transition_forward (the last rank: forward_prepare),
// then the local forward from an initial state (the first rank: none); backward: transition_backward
// of dS_ext alone (the first rank: backward_prepare), then the local backward with dht (the last rank:
// none); the local passes with set_inputs_unchanged on, as the CP layer calls them. Median ms of the
// forward part and of both: what a rank computes beyond the plain forward+backward row. Unchecked
// (the cp-sweeps judge these calls).
Row bench_cp_rank(Backend& be, const Problem& p, std::vector<BenchInputs>& in, const Outputs& out, int warmup,
                  int repeat, std::string prefix, const std::string& role) {
  if (Support sup = be.supports_backward(p); !sup) return {prefix + "unsupported: " + sup.reason + " |"};
  const bool first = role == "first", last = role == "last";  // else "middle" (checked with the options)
  BwdBuffers gb = make_bwd_buffers(be, p, in[0].in.q.dtype);
  const Shape tf_shape = transition_shape(1, p.HV, p.K, p.V), tb_shape = transition_s_shape(1, p.HV, p.K, p.V);
  const Shape st_shape{p.N, p.HV, p.K, p.V};
  auto bytes = [](const Shape& s) { return sizeof(float) * size_t(shape_numel(s)); };
  DeviceBuffer tf(be.queue(), bytes(tf_shape)), tb(be.queue(), bytes(tb_shape)), h0(be.queue(), bytes(st_shape)),
      dht(be.queue(), bytes(st_shape));
  const TensorView tfv(tf.get(), DType::f32, tf_shape, be.device()), tbv(tb.get(), DType::f32, tb_shape, be.device());
  const TensorView h0v(h0.get(), DType::f32, st_shape, be.device()), dhtv(dht.get(), DType::f32, st_shape, be.device());
  be.queue().fill_zero(h0v), be.queue().fill_zero(dhtv);
  const size_t sets = in.size();
  auto local = [&](auto&& call) {
    be.set_inputs_unchanged(true);
    call();
    be.set_inputs_unchanged(false);
  };
  auto fwd = [&](int i) {
    Inputs loc = in[size_t(i) % sets].in;
    loc.initial_state = {};
    if (last) be.forward_prepare(p, loc);
    else be.transition_forward(p, loc, p.N - 1, tfv);
    loc.initial_state = first ? TensorView() : h0v;
    local([&] { be.forward(p, loc, out); });
  };
  auto bwd = [&](int i) {
    Inputs loc = in[size_t(i) % sets].in;
    loc.initial_state = first ? TensorView() : h0v;
    const TensorView& d_o = in[size_t(i) % sets].d_o;
    if (first) be.backward_prepare(p, loc, d_o);
    else be.transition_backward(p, loc, d_o, 0, tbv);
    local([&] { be.backward(p, loc, {d_o, last ? TensorView() : dhtv}, gb.g); });
  };
  for (int i = 0; i < warmup + 1; ++i) fwd(i), bwd(i);
  be.synchronize();
  std::vector<double> f, fb;
  for (int i = 0; i < repeat; ++i) {
    const double a = be.queue().time_ms([&] { fwd(i); });
    fb.push_back(a + be.queue().time_ms([&] { bwd(i); })), f.push_back(a);
  }
  std::sort(f.begin(), f.end()), std::sort(fb.begin(), fb.end());
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s | %.3f | %.3f | unchecked |", role.c_str(), f[f.size() / 2], fb[fb.size() / 2]);
  return {prefix + buf};
}

struct RunSettings {
  int warmup = 5, repeat = 50, sets = 3;
  bool backward = false, transitions = false, explain = false, check = true, fused = false;
  std::string cp_rank;  // --cp-rank: bench_cp_rank's role
};

// [0, T] cut into `seqs` nearly equal sequences (the first T % seqs one token longer).
std::vector<int64_t> equal_cu(int64_t T, int64_t seqs) {
  std::vector<int64_t> cu = {0};
  for (int64_t n = 0; n < seqs; ++n) cu.push_back(cu.back() + T / seqs + (n < T % seqs ? 1 : 0));
  return cu;
}

Row bench_shape(Backend& be, Variant var, int64_t T, int64_t seqs, int64_t H, int64_t K, int64_t V, DType dt,
                const RunSettings& rs) {
  const int warmup = rs.warmup, repeat = rs.repeat, sets = rs.sets;
  const bool backward = rs.backward;
  Gate gate;
  gate.check = rs.check, gate.shape = {var, H, K, V, dt, rs.fused}, gate.used_before = be.queue().device_memory_used();
  std::vector<BenchInputs> in;
  for (int s = 0; s < sets; ++s)
    in.push_back(make_bench_inputs(be, gate.shape, 0, T, gate.seed + uint64_t(s), backward || rs.transitions || !rs.cp_rank.empty()));
  ProblemOptions opt;
  opt.compute = DType::f32, opt.check_finite = false;
  if (seqs > 1) opt.cu_seqlens = equal_cu(T, seqs);
  const Problem p = make_problem(var, in[0].in, gate.shape.flags(), opt);
  std::ostringstream os;
  os << "| " << variant_name(var) << " | " << (seqs > 1 ? detail::concat(seqs, "x", T / seqs) : std::to_string(T))
     << " | " << H << " | ";
  // --explain: the plan (decided before the run), then how the last forward ran (the kernels picked)
  const std::string planned = rs.explain ? be.explain_forward(p) : "";
  auto plan = [&] {
    if (!rs.explain) return std::string();
    // appended piecewise: g++ 12 warns (-Wrestrict, a false positive) on " " + s + " |"
    std::string ran = be.explain_last_forward(), s = " ";
    s.append(planned.empty() ? "-" : planned);
    if (!ran.empty()) s.append("; ").append(ran);
    return s.append(" |");
  };
  if (Support sup = be.supports(p); !sup) return {os.str() + "unsupported: " + sup.reason + " |"};
  // (each row's text first, then plan(): it reports the forwards the row ran)
  auto with_plan = [&](Row r) { return Row{r.text + plan()}; };
  if (rs.transitions) return with_plan(bench_transitions(be, p, in, warmup, repeat, os.str(), gate));
  DeviceBuffer o(be.queue(), size_t(T * H * V) * size_t(dtype_size(dt)));
  const Outputs out{TensorView(o.get(), dt, {1, T, H, V}, be.device()), {}};
  if (!rs.cp_rank.empty()) return with_plan(bench_cp_rank(be, p, in, out, warmup, repeat, os.str(), rs.cp_rank));
  if (backward) return with_plan(bench_backward(be, p, in, out, warmup, repeat, os.str(), gate));
  be.forward(p, in[0].in, out);  // set 0, judged before anything is timed
  const BenchVerdict v = gate.run(be, p, out.o, {});
  if (!v.ok) return {os.str() + v.text + " |" + plan()};
  for (int i = 0; i < warmup; ++i) be.forward(p, in[size_t(i % sets)].in, out);
  be.synchronize();
  const double mib = gate.memory_mib(be);
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i)
    ms.push_back(be.queue().time_ms([&] { be.forward(p, in[size_t(i % sets)].in, out); }));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2], th = double(T * H), C = 64, es = dtype_size(dt);
  const double Kd = double(K), Vd = double(V), gw = var == Variant::gdn ? 1 : Kd;
  const double bytes = th * (es * (2 * Kd + 2 * Vd) + 4 * gw + 4);
  const double flops = th * (4 * C * Kd + C * C / 3 + 2 * C * (Kd + Vd) + 6 * Kd * Vd + 2 * C * Vd);
  const double fused = th * (6 * Kd * Vd + 4 * C * (Kd + Vd));
  const double lb_ms = std::max(fused / 800e12, bytes / 3.0e12) * 1e3, fla = fla_shape(p, dt) ? fla_ms(var, T, H) : 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f | %.3f | %.0f | %.1f | %.0f | %.0f%% | %s | %s | %s | %s |", med, ms.front(),
                bytes / med * 1e-6, flops / med * 1e-9, lb_ms * 1e3, 100 * lb_ms / med,
                fla > 0 ? detail::concat(fla).c_str() : "-",
                fla > 0 ? detail::concat(int(std::lround(100 * fla / med)), "%").c_str() : "-",
                mib >= 0 ? detail::concat(std::lround(mib)).c_str() : "-", v.text.c_str());
  return {os.str() + buf + plan()};
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args a(argc, argv,
         {"backend", "variant", "T", "H", "K", "V", "dtype", "warmup", "repeat", "sets", "backward", "seqs", "segment",
          "check", "transitions", "fused", "keep", "cp-rank"},
         {"explain"}, "bench");
  const std::string name = a.get("backend", "cuda-chunkwise");
  const DType dt = dtype_parse(a.get("dtype", "bfloat16"));
  const int64_t K = a.get_int("K", 128), V = a.get_int("V", 128);
  const bool backward = a.get_switch("backward").value_or(false);
  RunSettings rs;
  rs.warmup = int(a.get_int("warmup", 5)), rs.repeat = int(a.get_int("repeat", 50)), rs.sets = int(a.get_int("sets", 3));
  rs.backward = backward, rs.explain = a.has("explain"), rs.check = a.get_switch("check").value_or(true);
  rs.transitions = a.get_switch("transitions").value_or(false);
  rs.cp_rank = a.get("cp-rank", "");
  KCP_CHECK(rs.cp_rank.empty() || rs.cp_rank == "first" || rs.cp_rank == "middle" || rs.cp_rank == "last",
            "bench: --cp-rank: expected first, middle or last, got '", rs.cp_rank, "'");
  rs.fused = a.get_switch("fused").value_or(false);
  const int warmup = rs.warmup, repeat = rs.repeat, sets = rs.sets;
  KCP_CHECK(repeat >= 1 && sets >= 1 && warmup >= 0, "bench: --repeat and --sets must be >= 1, --warmup >= 0");
  BackendOptions bo;
  if (a.has("segment")) bo.segment = seg::parse_segment_option(a.get("segment", "auto"), "--segment");
  bo.keep_forward = a.get_switch("keep");
  const bool keep = val::keep_forward_resolved(bo);
  std::printf("kcp bench: %s, %s%s, %s q/k/v, float32 gates and beta%s, K=%lld V=%lld, B=1, median of %d after %d "
              "warm-up runs, %d rotating input sets\n",
              name.c_str(), !rs.cp_rank.empty() ? "one CP rank's calls" : rs.transitions ? "CP transitions" : backward ? "forward+backward" : "forward",
              keep ? " (kept forward)" : "",
              std::string(dtype_name(dt)).c_str(), rs.fused ? " (fused: L2 norm, beta sigmoid, softplus gate with A_log and dt_bias in the kernel)" : "",
              (long long)K, (long long)V, repeat, warmup, sets);
  std::vector<Row> rows;
  for (const std::string& vs : str_list(a.get("variant", "gdn,kda")))
    for (long long T : int_list(a.get("T", "8192,32768")))
      for (long long seqs : int_list(a.get("seqs", "1")))
        for (long long H : int_list(a.get("H", "16,32"))) {
          KCP_CHECK(seqs >= 1 && seqs <= T, "bench: --seqs must be in [1, T], got ", seqs);
          auto be = backend_create(name, bo);  // per row: no workspace of an earlier row is counted
          rows.push_back(bench_shape(*be, variant_parse(vs), T, seqs, H, K, V, dt, rs));
          std::printf("%s\n", rows.back().text.c_str());
          std::fflush(stdout);
        }
  if (!rs.cp_rank.empty()) {
    std::printf("\n| op | T | H | CP rank | fwd ms | fwd+bwd ms | oracle check |%s\n|---|---|---|---|---|---|---|%s\n",
                rs.explain ? " plan |" : "", rs.explain ? "---|" : "");
    for (const Row& r : rows) std::printf("%s\n", r.text.c_str());
    return 0;
  }
  if (rs.transitions) {
    std::printf("\n| op | T | H | transition_forward ms | transition_backward ms | oracle check |%s\n"
                "|---|---|---|---|---|---|%s\n", rs.explain ? " plan |" : "", rs.explain ? "---|" : "");
    for (const Row& r : rows) std::printf("%s\n", r.text.c_str());
    return 0;
  }
  std::printf("\n| op | T | H | median ms | min ms | GB/s | GFLOP/s | LB us | LB/time | FLA ms | FLA/time | MiB held |"
              " oracle check |%s\n|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n",
              rs.explain ? " plan |" : "", rs.explain ? "---|" : "");
  for (const Row& r : rows) std::printf("%s\n", r.text.c_str());
  return 0;
}

}  // namespace kcp::app
