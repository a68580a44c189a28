// The layer rows of `kcp cp-sweep` (see cp_sweep_layer.h). Rank r holds the packed tokens [lo, hi)
// of x; an empty rank holds none and runs the layer on T = 0 with one zero-length local sequence
// (as ContextParallel's own local call), taking part in every collective. Three things cross ranks:
//   conv halo:  the x rows of the min(W-1, pre_num_conv_tokens) tokens before lo, from right-aligned
//               [W-1, hidden] tails all-gathered from every rank; each halo row is read from the rank
//               that owns it, so a halo reaches through short and empty ranks. The layer projects them
//               itself (LayerInputs::x_halo) and runs its conv on the host (the oracle's conv1d, like
//               every non-kernel op of the row); in the backward their gradient dx_halo is
//               all-gathered back and added to dx of the ranks owning those tokens. Host tensors,
//               over the host communicator comm.control().
//   kernel:     cp::ContextParallel on the row's backend in place of the local kernel
//               (LayerInputs::kernel), over `comm` on the backend's memory. The kernel's inputs and
//               d_o go to the backend's device in the row's precision and o and the gradients come
//               back (val::DeviceMirror; a host backend works on the host tensors directly). It
//               all-reduces dA_log and ddt_bias itself.
//   weights:    every other weight gradient is a partial sum over the rank's tokens (halo rows
//               included), all-reduced in float64.
// No initial or final state, as in FLA's and Megatron's CP.
// Covered by tests/cp/CMakeLists.txt (cp-sweep at N = 1..4 includes these rows); scripts/gpu.sh.
#include "app/cp_sweep_layer.h"

#include <cmath>
#include <cstdio>
#include <functional>

#include "cp/context_parallel.h"
#include "validation/compare.h"
#include "validation/mirror.h"
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

// The kernel's inputs on the backend's device in precision dt (a host backend: the views themselves).
Inputs upload(val::DeviceMirror& dev, Inputs in, DType dt) {
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.A_log, &in.dt_bias, &in.initial_state})
    *t = dev.input(*t, dt);
  return in;
}

using KernelForward = std::function<void(const Problem&, const Inputs&, const Outputs&)>;
using KernelBackward = std::function<void(const Problem&, const Inputs&, const Cotangents&, const Grads&)>;

// The layer's kernel calls made by fwd / bwd with device views of `be`: the inputs and cotangents go
// up in the call's precision, o and the gradients come back into the layer's host tensors.
ref::LayerKernel on_backend(Backend& be, KernelForward fwd, KernelBackward bwd) {
  ref::LayerKernel k;
  k.forward = [&be, fwd](const Problem& p, const Inputs& in, const Outputs& out) {
    val::DeviceMirror dev(be);
    fwd(p, upload(dev, in, p.compute), Outputs{dev.output(out.o), dev.output(out.final_state)});
    dev.download();
  };
  k.backward = [&be, bwd](const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) {
    val::DeviceMirror dev(be);
    const Inputs din = upload(dev, in, p.compute);
    const Cotangents dd{dev.input(d.d_o, p.compute), dev.input(d.d_final_state, p.compute)};
    bwd(p, din, dd,
        Grads{dev.output(g.dq), dev.output(g.dk), dev.output(g.dv), dev.output(g.dg), dev.output(g.dbeta),
              dev.output(g.d_initial_state), dev.output(g.dA_log), dev.output(g.ddt_bias)});
    dev.download();
  };
  return k;
}

template <class S>
LayerTensors layer_tensors(Tensor<double> out, Tensor<double> dx, const ref::LayerParams<S>& dparams) {
  LayerTensors r;
  r.emplace_back("out", std::move(out)), r.emplace_back("dx", std::move(dx));
  for (auto& [name, t] : ref::layer_params_cast<double, S>(dparams)) r.emplace_back("d" + name, std::move(t));
  return r;
}

// The layer in one process in precision S; `kernel` empty: the config's CPU kernel (recurrent).
template <class S>
LayerTensors run_single(const val::LayerCaseData& d, const ref::LayerKernel& kernel) {
  const ref::LayerConfig& c = d.spec.config;
  const ref::LayerParams<S> w = ref::layer_params_cast<S, double>(d.params);
  ref::LayerInputs<S> in;
  in.x = to_tensor<S>(d.in.x.view());
  in.cu_seqlens = d.in.cu_seqlens;
  in.kernel = kernel;
  const ref::LayerStages<S> st = ref::layer_forward(c, w, in);
  const ref::LayerGrads<S> g = ref::layer_backward(c, w, in, to_tensor<S>(d.dout.view()), Tensor<S>());
  return layer_tensors(to_tensor<double>(st.out.view()), to_tensor<double>(g.dx.view()), g.dparams);
}

template <class S>
LayerTensors run_layer_cp(Comm& comm, Backend& be, const LayerReference& ref) {
  const val::LayerCaseData& d = ref.d;
  const ref::LayerConfig& c = d.spec.config;
  const std::vector<int64_t>& cu = d.in.cu_seqlens;
  Comm& host = comm.control();
  const CpContext ctx = cp::build_cp_context(cu, ref.bounds, comm.rank());
  cp::CpOptions opt;
  opt.problem.cu_seqlens = cu, opt.problem.chunk_size = c.chunk_size, opt.problem.compute = dtype_of<S>();
  opt.problem.scale = c.scale, opt.bounds = ref.bounds;
  cp::ContextParallel kernel_cp(comm, be, c.variant, ref::layer_kernel_flags(c), opt);
  const ref::LayerParams<S> w = ref::layer_params_cast<S, double>(d.params);
  ref::LayerInputs<S> in;
  in.x = token_slice<S>(d.in.x, ctx.lo, ctx.tokens());
  in.cu_seqlens = ctx.empty() ? std::vector<int64_t>{0, 0} : ctx.local_cu;  // empty rank: one empty sequence
  in.x_halo = gather_halo(host, ctx, in.x, c.conv_size);
  in.kernel = on_backend(
      be, [&](const Problem&, const Inputs& ki, const Outputs& ko) { kernel_cp.forward(ki, ko); },
      [&](const Problem&, const Inputs& ki, const Cotangents& kd, const Grads& kg) {
        kernel_cp.backward(ki, Cotangents{kd.d_o, {}}, kg);
      });
  const ref::LayerStages<S> st = ref::layer_forward(c, w, in);
  ref::LayerGrads<S> g = ref::layer_backward(c, w, in, token_slice<S>(d.dout, ctx.lo, ctx.tokens()), Tensor<S>());
  scatter_halo_grad(host, ctx, cu, g.dx_halo, c.conv_size, g.dx);
  LayerTensors r = layer_tensors(assemble(host, ctx, st.out, ctx.total()), assemble(host, ctx, g.dx, ctx.total()),
                                 g.dparams);
  for (auto& [name, t] : r)
    if (name != "out" && name != "dx" && name != "dA_log" && name != "ddt_bias")  // CP reduced those two
      host.all_reduce(t.data(), t.numel(), DType::f64, cp::ReduceOp::sum);
  return r;
}

}  // namespace

LayerGeometry layer_geometry_for(const Backend& be, bool quick) {
  const LayerGeometry small{4, 4, 16, quick ? 21 : 37};
  Problem p;  // the kernel call of the small cases (kda, lower-bound gate), as far as supports() reads it
  p.variant = Variant::kda, p.B = 1, p.T = 5, p.H = p.HV = 2, p.K = small.K, p.V = small.V, p.N = 1;
  p.chunk_size = small.C, p.compute = DType::f32, p.cu_seqlens = {0, 5};
  p.flags.use_gate_in_kernel = true, p.flags.lower_bound = -5.0, p.flags.safe_gate = true;
  if (be.supports(p) && be.supports_backward(p)) return small;
  return {32, 32, 64, quick ? 69 : 133};
}

std::vector<val::LayerCase> layer_cp_cases(uint64_t seed, const LayerGeometry& geo) {
  std::vector<val::LayerCase> cs;
  for (val::LayerCase c : val::named_layer_cases(seed))
    if (c.tag == "kda-megatron" || c.tag == "gdn-megatron" || c.tag == "kda-fused-lora") {
      c.config.K = geo.K, c.config.V = geo.V, c.config.chunk_size = geo.C;
      c.config.kernel = ref::CpuAlgorithm::recurrent;  // the oracle's kernel; the rows' is the backend's
      cs.push_back(c);
    }
  return cs;
}

LayerReference layer_reference(val::LayerCase lc, const SweepLayout& layout, int ranks) {
  lc.seqlens = layout.seqlens, lc.initial_state = false, lc.final_state = false;
  LayerReference r;
  r.d = val::make_layer_case(lc);
  r.bounds = layout.bounds.empty() ? cp::equal_bounds(r.d.in.x.dim(1), ranks) : layout.bounds;
  const ref::LayerConfig& c = r.d.spec.config;
  const ref::LayerStages<double> st = ref::layer_forward(c, r.d.params, r.d.in);
  const ref::LayerGrads<double> g = ref::layer_backward(c, r.d.params, r.d.in, r.d.dout, {});
  r.oracle = layer_tensors(st.out, g.dx, g.dparams);
  const LayerTensors f32 = run_single<float>(r.d, {});
  for (size_t i = 0; i < f32.size(); ++i)
    r.base_err.push_back(val::compare(f32[i].second.view(), r.oracle[i].second.view()).rel_l2);
  const Inputs kin{st.q.view(), st.k.view(), st.v.view(), st.g.view(), st.beta.view(),
                   r.d.params.at("A_log").view(), r.d.params.at("dt_bias").view(), {}};
  ProblemOptions po;
  po.scale = c.scale, po.chunk_size = c.chunk_size, po.compute = DType::f64, po.cu_seqlens = r.d.in.cu_seqlens;
  r.kernel = make_problem(c.variant, kin, ref::layer_kernel_flags(c), po);
  r.cond = val::grad_conditioning(r.kernel, kin, Cotangents{g.dstages.o.view(), {}}, g.dstages.g.view());
  return r;
}

LayerBaseline layer_baseline(Backend& be, const LayerReference& ref) {
  const LayerTensors single = run_single<float>(
      ref.d, on_backend(be, [&be](const Problem& p, const Inputs& in, const Outputs& o) { be.forward(p, in, o); },
                        [&be](const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) {
                          be.backward(p, in, d, g);
                        }));
  LayerBaseline b{ref.base_err, {}};
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string& name = single[i].first;
    const double e = val::compare(single[i].second.view(), ref.oracle[i].second.view()).rel_l2;
    const double rule = val::layer_float_rule_bar(ref.base_err[i], ref.cond.of(name));
    b.base[i] = std::max(b.base[i], e);
    if (e <= rule) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.1e > rule %.1e", b.notes.empty() ? "" : ", ", name.c_str(), e, rule);
    b.notes += buf;
  }
  return b;
}

RowVerdict sweep_layer_row(Comm& comm, Backend& backend, const LayerReference& ref, const std::vector<double>& base,
                           DType dt) {
  const LayerTensors got = dt == DType::f64 ? run_layer_cp<double>(comm, backend, ref)
                                            : run_layer_cp<float>(comm, backend, ref);
  RowVerdict v;
  double err[3] = {0, 0, 0};  // out, dx, worst weight gradient
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string& name = got[i].first;
    KCP_CHECK(name == ref.oracle[i].first, "cp-sweep: layer tensor lists differ at ", name);
    const val::Metrics m = val::compare(got[i].second.view(), ref.oracle[i].second.view());
    const double bar = dt == DType::f64 ? val::tol::kExactF64 : val::layer_float_rule_bar(base[i], ref.cond.of(name));
    const bool finite = m.finite_ok() && !std::isnan(m.rel_l2);
    double& e = err[std::min<size_t>(i, 2)];
    e = std::max(e, finite ? m.rel_l2 : INFINITY);
    v.worst_ratio = std::max(v.worst_ratio, finite ? m.rel_l2 / bar : INFINITY);
    if ((finite && m.rel_l2 <= bar) || !v.pass) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, ": rel_l2 %.3e > bar %.1e%s", m.rel_l2, bar, finite ? "" : " (NaN/Inf)");
    v.pass = false, v.failure = name + buf;
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "out %.1e dx %.1e dweights %.1e", err[0], err[1], err[2]);
  v.errors = buf;
  return v;
}

}  // namespace kcp::app
