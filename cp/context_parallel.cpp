// ContextParallel: validation and agreement, then the forward and backward passes of
// context_parallel.h. Local sequence i of this rank is global sequence seq_begin + i.
#include "cp/context_parallel.h"

#include <chrono>
#include <iomanip>
#include <optional>
#include <sstream>

#include "cp/agreement.h"
#include "cp/state_io.h"

namespace kcp::cp {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A rank without tokens may pass zero-size views whose data pointer is null; they count as given
// (an absent optional tensor is a default view without a shape).
bool given(const TensorView& t) { return !t.empty() || t.rank() > 0; }
TensorView nonnull(const TensorView& t) {
  static char dummy;  // never read: the view has no elements
  if (!t.empty() || t.rank() == 0) return t;
  TensorView r = t;
  r.data = &dummy;
  return r;
}

// A view's shape for the configuration string; the token dimension of a local tensor differs per
// rank by design, so it is written as '*'.
std::string shape_for_hash(const TensorView& t, bool token_tensor) {
  if (!given(t)) return "-";
  std::ostringstream os;
  for (int i = 0; i < t.rank(); ++i) os << (i ? "," : "[") << (token_tensor && i == 1 ? std::string("*") : std::to_string(t.dim(i)));
  os << "]" << dtype_name(t.dtype);
  return os.str();
}

Shape global_state_shape(const Problem& p, int64_t N) {
  return p.flags.state_v_first ? Shape{N, p.HV, p.V, p.K} : Shape{N, p.HV, p.K, p.V};
}

void expect_global_state(const char* name, const TensorView& t, const Shape& want) {
  if (t.empty()) return;
  KCP_CHECK(t.shape == want, name, ": CP takes the global per-sequence states, expected shape ", shape_str(want),
            ", got ", shape_str(t.shape));
  KCP_CHECK(t.device == Device::host, name, ": the CP layer needs host views");
}

template <class S>
Eigen::Map<const ref::Mat<S>> head_of(const Tensor<S>& t, int64_t hv) {
  return {t.data() + hv * t.dim(1) * t.dim(2), t.dim(1), t.dim(2)};
}

}  // namespace

std::string_view merge_name(MergeAlgorithm m) { return m == MergeAlgorithm::linear ? "linear" : "log-depth"; }

MergeAlgorithm merge_parse(std::string_view s) {
  if (s == "linear") return MergeAlgorithm::linear;
  if (s == "log-depth") return MergeAlgorithm::log_depth;
  throw Error(detail::concat("unknown merge '", s, "' (expected linear or log-depth)"));
}

struct ContextParallel::Local {
  Problem p;       // the local call; an empty rank holds a placeholder with one empty sequence
  int64_t N = 0;   // global sequence count
};

ContextParallel::ContextParallel(Comm& comm, Backend& backend, Variant variant, const Flags& flags, CpOptions opt)
    : comm_(comm), backend_(backend), variant_(variant), flags_(flags), opt_(std::move(opt)) {
  const std::vector<int64_t>& cu = opt_.problem.cu_seqlens;
  KCP_CHECK(!cu.empty(), "cp: cu_seqlens (global) is required; a dense batch is one sequence per row, pass [0, T]");
  if (opt_.bounds.empty()) opt_.bounds = equal_bounds(cu.back(), comm_.size());
  KCP_CHECK(int64_t(opt_.bounds.size()) == comm_.size() + 1, "cp bounds: expected P+1 = ", comm_.size() + 1,
            " entries for ", comm_.size(), " ranks, got ", opt_.bounds.size());
  ctx_ = build_cp_context(cu, opt_.bounds, comm_.rank());
}

ContextParallel::Local ContextParallel::prepare(const Inputs& in, std::string& config) const {
  std::ostringstream os;
  os << std::setprecision(17) << "P=" << comm_.size() << " backend=" << backend_.name() << " merge=" << merge_name(opt_.merge)
     << " variant=" << variant_name(variant_) << " l2=" << flags_.use_qk_l2norm_in_kernel
     << " bsig=" << flags_.use_beta_sigmoid_in_kernel << " neg=" << flags_.allow_neg_eigval
     << " gate=" << flags_.use_gate_in_kernel << " lb=" << (flags_.lower_bound ? *flags_.lower_bound : 0.0)
     << " safe=" << flags_.safe_gate << " vfirst=" << flags_.state_v_first
     << " scale=" << (opt_.problem.scale ? *opt_.problem.scale : 0.0) << " C=" << opt_.problem.chunk_size
     << " compute=" << dtype_name(opt_.problem.compute) << " q=" << shape_for_hash(in.q, true)
     << " k=" << shape_for_hash(in.k, true) << " v=" << shape_for_hash(in.v, true) << " g=" << shape_for_hash(in.g, true)
     << " beta=" << shape_for_hash(in.beta, true) << " A_log=" << shape_for_hash(in.A_log, false)
     << " dt_bias=" << shape_for_hash(in.dt_bias, false) << " h0=" << shape_for_hash(in.initial_state, false)
     << " A_log values " << content_hash(in.A_log) << " dt_bias values " << content_hash(in.dt_bias);
  os << " bounds=";
  for (int64_t b : opt_.bounds) os << b << ",";
  os << " cu=";
  for (int64_t x : opt_.problem.cu_seqlens) os << x << ",";
  config = os.str();

  KCP_CHECK(backend_.device() == Device::host, "cp: backend ", backend_.name(),
            " computes on a device; the MPI layer works on host buffers (NCCL comes with the CUDA CP issue)");
  KCP_CHECK(in.q.rank() == 4 && in.q.dim(0) == 1, "q: CP takes this rank's part as [1, T_local, H, K], got ",
            shape_str(in.q.shape));
  KCP_CHECK(in.q.dim(1) == ctx_.tokens(), "q: rank ", ctx_.rank, " owns tokens [", ctx_.lo, ", ", ctx_.hi, ") = ",
            ctx_.tokens(), " tokens of the global cu_seqlens, but q has T_local = ", in.q.dim(1));
  Inputs loc = in;
  for (TensorView* t : {&loc.q, &loc.k, &loc.v, &loc.g, &loc.beta}) *t = nonnull(*t);
  loc.initial_state = {};
  ProblemOptions po = opt_.problem;
  po.cu_seqlens = ctx_.empty() ? std::vector<int64_t>{0, 0} : ctx_.local_cu;
  Local l{make_problem(variant_, loc, flags_, po), int64_t(opt_.problem.cu_seqlens.size()) - 1};
  expect_global_state("initial_state", in.initial_state, global_state_shape(l.p, l.N));
  require_support(backend_, l.p);
  return l;
}

template <class S>
Tensor<S> ContextParallel::exchange_and_merge(const Summary<S>& mine, bool backward, CpPhaseTimes& times) {
  const CpContext& c = ctx_;
  const bool needed = backward ? !c.is_last_rank : !c.is_first_rank;
  auto t = Clock::now();
  if (opt_.timing_barrier) {
    comm_.barrier();
    times.wait = since(t);
    t = Clock::now();
  }
  if (opt_.merge == MergeAlgorithm::log_depth) {
    Tensor<S> x = scan_exclusive(comm_, mine, backward);  // communication and merge interleave
    times.exchange = since(t);
    return needed ? x : Tensor<S>();
  }
  std::vector<S> all(size_t(c.size * mine.numel()));
  all_gather(comm_, mine.packed.data(), all.data(), mine.numel());
  times.exchange = since(t);
  t = Clock::now();
  std::vector<int> order;  // forward: oldest rank first; backward: farthest rank first
  if (needed && !backward)
    for (int j = c.rank - int(c.pre_num_ranks); j < c.rank; ++j) order.push_back(j);
  if (needed && backward)
    for (int j = c.rank + int(c.post_num_ranks); j > c.rank; --j) order.push_back(j);
  Tensor<S> x = needed ? fold_linear(all.data(), mine.HV, mine.K, mine.V, order) : Tensor<S>();
  times.merge = since(t);
  return x;
}

// Initial states of the local call [N_local,HV,..]: the merged state for a continuing first
// sequence (expand_h0), the given h0 for sequences that start here; empty when all would be zero.
template <class S>
Tensor<S> ContextParallel::local_initial_states(const Local& l, const Inputs& in, const Tensor<double>& merged) const {
  const CpContext& c = ctx_;
  if (c.empty() || (in.initial_state.empty() && c.is_first_rank)) return {};
  Tensor<S> h(global_state_shape(l.p, c.n_local()));
  for (int64_t i = 0; i < c.n_local(); ++i) {
    if (!c.starts_here(i)) store_kmajor(h.view(), i, merged, flags_.state_v_first);
    else if (!in.initial_state.empty()) copy_state_entry(h.view(), i, in.initial_state, c.seq_begin + i);
  }
  return h;
}

namespace {
// Global state view: entry n from the local view where `owned(i)`, zero elsewhere.
template <class Owned>
void scatter_states(const CpContext& c, const TensorView& global, const TensorView& local, Owned owned) {
  if (global.empty()) return;
  for (int64_t n = 0; n < global.dim(0); ++n) {
    const int64_t i = n - c.seq_begin;
    if (i >= 0 && i < c.n_local() && owned(i)) copy_state_entry(global, n, local, i);
    else zero_state_entry(global, n);
  }
}
}  // namespace

template <class S>
void ContextParallel::forward_impl(const Local& l, const Inputs& in, const Outputs& out) {
  const CpContext& c = ctx_;
  const Problem& p = l.p;
  const int64_t HV = p.HV, K = p.K, V = p.V, last = c.n_local() - 1;
  Inputs loc = in;
  loc.initial_state = {};
  auto t = Clock::now();
  Summary<S> mine = c.empty() ? Summary<S>::identity(HV, K, V) : Summary<S>(HV, K, V);
  if (!c.is_last_rank) {  // the last local sequence continues: summarize it
    Tensor<S> s_ext({HV, K, V}), m({HV, K, K});
    backend_.transition_forward(p, loc, last, {s_ext.view(), m.view()});
    const bool starts = c.starts_here(last);
    const Tensor<S> h0 = starts && !in.initial_state.empty()
                             ? load_kmajor<S>(in.initial_state, c.seq_begin + last, K, V, flags_.state_v_first)
                             : Tensor<S>();
    for (int64_t h = 0; h < HV; ++h) {
      auto a = mine.head(h);
      a.leftCols(V) = head_of(s_ext, h);
      a.rightCols(K) = head_of(m, h);
      if (!h0.empty()) a.leftCols(V) += head_of(m, h) * head_of(h0, h);  // the run from h0 (5.7)
      if (starts && opt_.merge == MergeAlgorithm::log_depth) a.rightCols(K).setZero();  // scan reset
    }
  }
  fwd_times_.transition = since(t);
  const Tensor<S> merged = exchange_and_merge(mine, false, fwd_times_);
  saved_h0_ = Tensor<double>();  // compress_h0: keep only the merged state
  if (!merged.empty()) {
    saved_h0_ = Tensor<double>(merged.shape());
    for (int64_t i = 0; i < merged.numel(); ++i) saved_h0_.data()[i] = double(merged.data()[i]);
  }
  t = Clock::now();
  Tensor<S> ht_local;
  if (!c.empty()) {
    const Tensor<S> h0_local = local_initial_states<S>(l, in, saved_h0_);
    loc.initial_state = h0_local.view();
    if (!out.final_state.empty()) ht_local = Tensor<S>(global_state_shape(p, c.n_local()));
    backend_.forward(p, loc, {out.o, ht_local.view()});
  }
  scatter_states(c, out.final_state, ht_local.view(), [&](int64_t i) { return c.ends_here(i); });
  fwd_times_.local = since(t);
}

template <class S>
void ContextParallel::backward_impl(const Local& l, const Inputs& in, const Cotangents& d, const Grads& gr) {
  const CpContext& c = ctx_;
  const Problem& p = l.p;
  const int64_t HV = p.HV, K = p.K, V = p.V, last = c.n_local() - 1;
  Inputs loc = in;
  const Tensor<S> h0_local = local_initial_states<S>(l, in, saved_h0_);  // expand_h0
  loc.initial_state = h0_local.view();
  auto t = Clock::now();
  Summary<S> mine = c.empty() ? Summary<S>::identity(HV, K, V) : Summary<S>(HV, K, V);
  if (!c.is_first_rank) {  // the first local sequence continues from earlier ranks: summarize it backward
    Tensor<S> ds({HV, K, V}), mt({HV, K, K});
    backend_.transition_backward(p, loc, d.d_o, 0, {ds.view(), mt.view()});
    const bool ends = c.ends_here(0);
    const Tensor<S> dht = ends && !d.d_final_state.empty()
                              ? load_kmajor<S>(d.d_final_state, c.seq_begin, K, V, flags_.state_v_first)
                              : Tensor<S>();
    for (int64_t h = 0; h < HV; ++h) {
      auto a = mine.head(h);
      a.leftCols(V) = head_of(ds, h);
      a.rightCols(K) = head_of(mt, h);
      if (!dht.empty()) a.leftCols(V) += head_of(mt, h) * head_of(dht, h);  // dht folded in (5.7)
      if (ends && opt_.merge == MergeAlgorithm::log_depth) a.rightCols(K).setZero();
    }
  }
  bwd_times_.transition = since(t);
  const Tensor<S> merged = exchange_and_merge(mine, true, bwd_times_);
  t = Clock::now();
  Tensor<S> dh0_local, dA({HV}), ddt(gr.ddt_bias.empty() ? Shape{0} : gr.ddt_bias.shape);
  if (!c.empty()) {
    Tensor<S> dht_local;
    if (!d.d_final_state.empty() || !c.is_last_rank) {
      dht_local = Tensor<S>(global_state_shape(p, c.n_local()));
      for (int64_t i = 0; i < c.n_local(); ++i)
        if (c.ends_here(i) && !d.d_final_state.empty()) copy_state_entry(dht_local.view(), i, d.d_final_state, c.seq_begin + i);
      if (!c.is_last_rank) store_kmajor(dht_local.view(), last, merged, flags_.state_v_first);
    }
    if (!gr.d_initial_state.empty()) dh0_local = Tensor<S>(global_state_shape(p, c.n_local()));
    Grads lg = gr;
    lg.d_initial_state = dh0_local.view();
    lg.dA_log = gr.dA_log.empty() ? TensorView() : dA.view();
    lg.ddt_bias = gr.ddt_bias.empty() ? TensorView() : ddt.view();
    backend_.backward(p, loc, {d.d_o, dht_local.view()}, lg);
  }
  scatter_states(c, gr.d_initial_state, dh0_local.view(), [&](int64_t i) { return c.starts_here(i); });
  bwd_times_.local = since(t);
  t = Clock::now();
  // parameters shared by all ranks: sum the rank-local partial gradients
  for (auto [part, view] : {std::pair{&dA, gr.dA_log}, std::pair{&ddt, gr.ddt_bias}}) {
    if (view.empty()) continue;
    all_reduce_sum(comm_, part->data(), part->numel());
    for (int64_t i = 0; i < part->numel(); ++i) view.set(i * view.stride[0], double(part->data()[i]));
  }
  bwd_times_.reduce = since(t);
}

void ContextParallel::forward(const Inputs& in, const Outputs& out) {
  fwd_times_ = {};
  const auto t = Clock::now();
  std::string config, err;
  std::optional<Local> l;
  try {
    l = prepare(in, config);
    check_outputs(l->p, {nonnull(out.o), {}});
    expect_global_state("final_state", out.final_state, global_state_shape(l->p, l->N));
    config += " ht=" + shape_for_hash(out.final_state, false);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm_, "cp forward", config, err);
  fwd_times_.check = since(t);
  if (l->p.compute == DType::f64) forward_impl<double>(*l, in, out);
  else forward_impl<float>(*l, in, out);
  have_forward_ = true;
}

void ContextParallel::backward(const Inputs& in, const Cotangents& d, const Grads& gr) {
  bwd_times_ = {};
  const auto t = Clock::now();
  std::string config, err;
  std::optional<Local> l;
  try {
    KCP_CHECK(have_forward_, "cp backward: run forward on the same inputs first (it keeps the merged initial state)");
    l = prepare(in, config);
    const Shape st = global_state_shape(l->p, l->N);
    expect_global_state("dht", d.d_final_state, st);
    expect_global_state("d_initial_state", gr.d_initial_state, st);
    KCP_CHECK(gr.d_initial_state.empty() || !in.initial_state.empty(),
              "d_initial_state: requested, but initial_state was not given");
    check_cotangents(l->p, {nonnull(d.d_o), {}});
    Grads local = gr;
    local.d_initial_state = {};
    check_grads(l->p, in, local);
    config += " dht=" + shape_for_hash(d.d_final_state, false) + " do=" + shape_for_hash(d.d_o, true);
    for (const TensorView* g : {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.d_initial_state, &gr.dA_log, &gr.ddt_bias})
      config += given(*g) ? "1" : "0";
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm_, "cp backward", config, err);
  bwd_times_.check = since(t);
  if (l->p.compute == DType::f64) backward_impl<double>(*l, in, d, gr);
  else backward_impl<float>(*l, in, d, gr);
}

}  // namespace kcp::cp
