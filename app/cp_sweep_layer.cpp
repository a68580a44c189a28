// The layer rows of `kcp cp-sweep`: the whole KDA / GDN layer (reference/layer.h) under context
// parallelism on the CPU backends, against the single-process float64 layer oracle. Rank r holds the
// packed tokens [lo, hi) of x. Two things cross ranks:
//   conv halo:  the x rows of the min(W-1, pre_num_conv_tokens) tokens before lo (all-gathered
//               right-aligned [W-1, hidden] tails; a rank may hold fewer than W-1 tokens). The layer
//               projects them itself (LayerInputs::x_halo); in the backward their gradient dx_halo is
//               all-gathered back and added to dx of the ranks owning those tokens.
//   kernel:     cp::ContextParallel (state transitions, FLA's CP) in place of the local kernel
//               (LayerInputs::kernel); it all-reduces dA_log and ddt_bias itself.
// Every other weight gradient is a partial sum over the rank's tokens (halo rows included) and is
// all-reduced. No initial or final state, as in FLA's and Megatron's CP.
// Bars: float64 rel_l2 <= tol::kExactF64; float32 rel_l2 <= tol::kFloatVsDouble against float64.
// Covered by tests/cp/CMakeLists.txt (cp-sweep at N = 1..4 includes these rows).
#include "app/cp_sweep_layer.h"

#include <cstdio>

#include "cp/context_parallel.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

namespace kcp::app {
namespace {
using cp::Comm;
using cp::CpContext;

template <class S>
Tensor<S> token_slice(const Tensor<double>& t, int64_t lo, int64_t n) {  // [1,T,D] -> [1,n,D] in S
  const int64_t D = t.dim(2);
  Tensor<S> r({1, n, D});
  for (int64_t i = 0; i < n * D; ++i) r.data()[i] = S(t.data()[lo * D + i]);
  return r;
}

// The x rows of tokens [lo-h, lo), h = min(W-1, pre_num_conv_tokens), from the ranks owning them.
template <class S>
Tensor<S> gather_halo(Comm& comm, const CpContext& ctx, const Tensor<S>& x, int64_t W) {
  const int64_t D = x.dim(2), m = std::min(W - 1, ctx.tokens()), h = std::min(W - 1, ctx.pre_num_conv_tokens);
  Tensor<S> tail({W - 1, D}), all({comm.size(), W - 1, D});
  for (int64_t i = 0; i < m * D; ++i) tail.data()[(W - 1 - m) * D + i] = x.data()[(ctx.tokens() - m) * D + i];
  comm.all_gather(tail.data(), all.data(), (W - 1) * D, dtype_of<S>());
  if (h == 0) return {};
  Tensor<S> halo({h, D});
  for (int64_t i = 0; i < h; ++i) {
    const int64_t t = ctx.lo - h + i;
    const int j = cp::rank_of_token(ctx.bounds, t);
    const int64_t row = (W - 1) - (ctx.bounds[size_t(j) + 1] - t);
    for (int64_t e = 0; e < D; ++e) halo(i, e) = all(j, row, e);
  }
  return halo;
}

// Adds every rank's halo gradient to dx of the tokens this rank owns.
template <class S>
void scatter_halo_grad(Comm& comm, const CpContext& ctx, const std::vector<int64_t>& cu, const Tensor<S>& dhalo,
                       int64_t W, Tensor<S>& dx) {
  const int64_t D = dx.dim(2), h = dhalo.empty() ? 0 : dhalo.dim(0);
  Tensor<S> block({W - 1, D}), all({comm.size(), W - 1, D});
  for (int64_t i = 0; i < h * D; ++i) block.data()[(W - 1 - h) * D + i] = dhalo.data()[i];
  comm.all_gather(block.data(), all.data(), (W - 1) * D, dtype_of<S>());
  for (int j = 0; j < comm.size(); ++j) {
    const CpContext cj = cp::build_cp_context(cu, ctx.bounds, j);
    const int64_t hj = std::min(W - 1, cj.pre_num_conv_tokens);
    for (int64_t i = 0; i < hj; ++i) {
      const int64_t t = cj.lo - hj + i;
      if (t < ctx.lo || t >= ctx.hi) continue;
      for (int64_t e = 0; e < D; ++e) dx(0, t - ctx.lo, e) += all(j, W - 1 - hj + i, e);
    }
  }
}

// A rank's rows placed into a zero global [1,T,D] tensor and summed over ranks: the whole tensor.
template <class S>
Tensor<double> assemble(Comm& comm, const CpContext& ctx, const Tensor<S>& local, int64_t T) {
  const int64_t D = local.dim(2);
  Tensor<double> g({1, T, D});
  for (int64_t i = 0; i < ctx.tokens() * D; ++i) g.data()[ctx.lo * D + i] = double(local.data()[i]);
  comm.all_reduce(g.data(), g.numel(), DType::f64, cp::ReduceOp::sum);
  return g;
}

struct LayerCpResult {
  Tensor<double> out, dx;
  ref::LayerParams<double> dparams;
};

template <class S>
LayerCpResult run_layer_cp(Comm& comm, Backend& be, const val::LayerCaseData& d, const std::vector<int64_t>& bounds) {
  const ref::LayerConfig& c = d.spec.config;
  const std::vector<int64_t>& cu = d.in.cu_seqlens;
  const CpContext ctx = cp::build_cp_context(cu, bounds, comm.rank());
  cp::CpOptions opt;
  opt.problem.cu_seqlens = cu, opt.problem.chunk_size = c.chunk_size, opt.problem.compute = dtype_of<S>();
  opt.problem.scale = c.scale, opt.bounds = bounds;
  cp::ContextParallel kernel_cp(comm, be, c.variant, ref::layer_kernel_flags(c), opt);
  const ref::LayerParams<S> w = ref::layer_params_cast<S, double>(d.params);
  ref::LayerInputs<S> in;
  in.x = token_slice<S>(d.in.x, ctx.lo, ctx.tokens());
  in.cu_seqlens = ctx.local_cu;
  in.x_halo = gather_halo(comm, ctx, in.x, c.conv_size);
  in.kernel.forward = [&](const Problem&, const Inputs& ki, const Outputs& ko) { kernel_cp.forward(ki, ko); };
  in.kernel.backward = [&](const Problem&, const Inputs& ki, const Cotangents& kd, const Grads& kg) {
    kernel_cp.backward(ki, Cotangents{kd.d_o, {}}, kg);
  };
  const ref::LayerStages<S> st = ref::layer_forward(c, w, in);
  ref::LayerGrads<S> g = ref::layer_backward(c, w, in, token_slice<S>(d.dout, ctx.lo, ctx.tokens()), Tensor<S>());
  scatter_halo_grad(comm, ctx, cu, g.dx_halo, c.conv_size, g.dx);
  LayerCpResult r{assemble(comm, ctx, st.out, ctx.total()), assemble(comm, ctx, g.dx, ctx.total()), {}};
  for (auto& [name, t] : g.dparams) {
    Tensor<double> s = ref::layer_params_cast<double, S>(ref::LayerParams<S>{{name, t}}).at(name);
    if (name != "A_log" && name != "dt_bias")  // ContextParallel all-reduced these already
      comm.all_reduce(s.data(), s.numel(), DType::f64, cp::ReduceOp::sum);
    r.dparams[name] = std::move(s);
  }
  return r;
}

}  // namespace

std::vector<val::LayerCase> layer_cp_cases(uint64_t seed) {
  std::vector<val::LayerCase> cs;
  for (const val::LayerCase& c : val::named_layer_cases(seed))
    if (c.tag == "kda-megatron" || c.tag == "gdn-megatron" || c.tag == "kda-fused-lora") cs.push_back(c);
  return cs;
}

RowVerdict sweep_layer_row(Comm& comm, Backend& backend, const SweepLayout& layout, val::LayerCase lc, DType dt) {
  lc.seqlens = layout.seqlens, lc.initial_state = false, lc.final_state = false;
  lc.config.kernel = backend.name() == "cpu-chunkwise" ? ref::CpuAlgorithm::chunkwise : ref::CpuAlgorithm::recurrent;
  lc.config.chunk_size = 16;  // several chunks per rank on the sweep's short parts
  const val::LayerCaseData d = val::make_layer_case(lc);
  const std::vector<int64_t> bounds = layout.bounds.empty() ? cp::equal_bounds(d.in.x.dim(1), comm.size()) : layout.bounds;
  const LayerCpResult got = dt == DType::f64 ? run_layer_cp<double>(comm, backend, d, bounds)
                                             : run_layer_cp<float>(comm, backend, d, bounds);
  const ref::LayerStages<double> st = ref::layer_forward(d.spec.config, d.params, d.in);
  const ref::LayerGrads<double> g = ref::layer_backward(d.spec.config, d.params, d.in, d.dout, {});
  const double bar = dt == DType::f64 ? val::tol::kExactF64 : val::tol::kFloatVsDouble;
  RowVerdict v;
  char buf[96];
  const auto judge = [&](const std::string& name, const Tensor<double>& a, const Tensor<double>& b) {
    const double e = val::compare(a.view(), b.view()).rel_l2;
    v.worst_ratio = std::max(v.worst_ratio, e / bar);
    if (e > bar && v.pass) v.pass = false, v.failure = name + ": rel_l2 " + std::to_string(e) + " > bar";
    return e;
  };
  double ew = 0;
  for (const auto& [name, t] : g.dparams) ew = std::max(ew, judge(name, got.dparams.at(name), t));
  std::snprintf(buf, sizeof buf, "out %.1e dx %.1e dweights %.1e", judge("out", got.out, st.out),
                judge("dx", got.dx, g.dx), ew);
  v.errors = buf;
  return v;
}

}  // namespace kcp::app
