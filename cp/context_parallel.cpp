// ContextParallel: validation and agreement, then the forward and backward passes of
// context_parallel.h. Local sequence i of this rank is global sequence seq_begin + i.
#include "cp/context_parallel.h"

#include <chrono>
#include <iomanip>
#include <optional>
#include <sstream>

#include "core/transition.h"
#include "cp/agreement.h"
#include "cp/merge.h"

namespace kcp::cp {
namespace {

using Clock = std::chrono::steady_clock;

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

void expect_global_state(const char* name, const TensorView& t, const Shape& want, Device device) {
  if (t.empty()) return;
  KCP_CHECK(t.shape == want, name, ": CP takes the global per-sequence states, expected shape ", shape_str(want),
            ", got ", shape_str(t.shape));
  KCP_CHECK(t.device == device, name, ": must live on the backend's device");
}

// The element view of a packed [1,HV,K,V+K] buffer.
TensorView element(const TensorView& t) { return transition_element(t, 0); }

// [HV,K,K] seen transposed in its last two axes (a stride swap, no copy).
TensorView transposed_kk(TensorView m) {
  std::swap(m.stride[1], m.stride[2]);
  return m;
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
  KCP_CHECK(comm_.device() == backend_.device(), "cp: the communicator (", comm_.name(), ") works on ",
            comm_.device() == Device::host ? "host" : "device", " memory but backend ", backend_.name(),
            " computes on ", backend_.queue().describe(), " (cp/comm_device.h makes a matching one)");
  if (opt_.bounds.empty()) opt_.bounds = equal_bounds(cu.back(), comm_.size());
  KCP_CHECK(int64_t(opt_.bounds.size()) == comm_.size() + 1, "cp bounds: expected P+1 = ", comm_.size() + 1,
            " entries for ", comm_.size(), " ranks, got ", opt_.bounds.size());
  ctx_ = build_cp_context(cu, opt_.bounds, comm_.rank());
}

template <class F>
void ContextParallel::phase(double& ms, F f) {
  if (opt_.timing) ms = backend_.queue().time_ms(f);
  else f();
}

ContextParallel::Local ContextParallel::prepare(const Inputs& in, std::string& config) const {
  Queue& q = backend_.queue();
  std::ostringstream os;
  os << std::setprecision(17) << "P=" << comm_.size() << " backend=" << backend_.name() << " comm=" << comm_.name()
     << " merge=" << merge_name(opt_.merge) << " variant=" << variant_name(variant_)
     << " l2=" << flags_.use_qk_l2norm_in_kernel << " bsig=" << flags_.use_beta_sigmoid_in_kernel
     << " neg=" << flags_.allow_neg_eigval << " gate=" << flags_.use_gate_in_kernel
     << " lb=" << (flags_.lower_bound ? *flags_.lower_bound : 0.0) << " safe=" << flags_.safe_gate
     << " vfirst=" << flags_.state_v_first << " scale=" << (opt_.problem.scale ? *opt_.problem.scale : 0.0)
     << " C=" << opt_.problem.chunk_size << " compute=" << dtype_name(opt_.problem.compute)
     << " q=" << shape_for_hash(in.q, true) << " k=" << shape_for_hash(in.k, true) << " v=" << shape_for_hash(in.v, true)
     << " g=" << shape_for_hash(in.g, true) << " beta=" << shape_for_hash(in.beta, true)
     << " A_log=" << shape_for_hash(in.A_log, false) << " dt_bias=" << shape_for_hash(in.dt_bias, false)
     << " h0=" << shape_for_hash(in.initial_state, false);
  config = os.str();  // the hashes below read device memory: only after the views are known good
  KCP_CHECK(in.q.rank() == 4 && in.q.dim(0) == 1, "q: CP takes this rank's part as [1, T_local, H, K], got ",
            shape_str(in.q.shape));
  KCP_CHECK(in.q.dim(1) == ctx_.tokens(), "q: rank ", ctx_.rank, " owns tokens [", ctx_.lo, ", ", ctx_.hi, ") = ",
            ctx_.tokens(), " tokens of the global cu_seqlens, but q has T_local = ", in.q.dim(1));
  KCP_CHECK(in.q.device == backend_.device(), "q: must live on the backend's device (", q.describe(), ")");
  Inputs loc = in;
  for (TensorView* t : {&loc.q, &loc.k, &loc.v, &loc.g, &loc.beta}) *t = nonnull(*t);
  loc.initial_state = {};
  ProblemOptions po = opt_.problem;
  po.cu_seqlens = ctx_.empty() ? std::vector<int64_t>{0, 0} : ctx_.local_cu;
  Local l{make_problem(variant_, loc, flags_, po), int64_t(opt_.problem.cu_seqlens.size()) - 1};
  expect_global_state("initial_state", in.initial_state, global_state_shape(l.p, l.N), backend_.device());
  require_support(backend_, l.p);
  config += " A_log values " + content_hash(q, in.A_log) + " dt_bias values " + content_hash(q, in.dt_bias);
  os.str("");
  os << " bounds=";
  for (int64_t b : opt_.bounds) os << b << ",";
  os << " cu=";
  for (int64_t x : opt_.problem.cu_seqlens) os << x << ",";
  config += os.str();
  return l;
}

// Collective: this rank's element `mine` [1,HV,K,V+K] in, the merged state [HV,K,V] out (when this
// rank needs it: `merged` not empty).
void ContextParallel::exchange_and_merge(const TensorView& mine, bool backward, const TensorView& merged,
                                         CpPhaseTimes& times) {
  const CpContext& c = ctx_;
  Queue& q = backend_.queue();
  if (opt_.timing) {
    const auto t0 = Clock::now();
    q.synchronize();
    comm_.control().barrier();
    times.wait = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  MergeTimes mt;
  if (opt_.merge == MergeAlgorithm::log_depth) {
    mt = merge_log_depth(comm_, q, mine, backward, merged, &ws_.merge);
  } else {
    // forward: ranks [r - pre, r) oldest first; backward: ranks (r, r + post] farthest first
    const int64_t first = backward ? c.rank + 1 : c.rank - c.pre_num_ranks;
    const int64_t count = backward ? c.post_num_ranks : c.pre_num_ranks;
    mt = merge_linear(comm_, q, mine, first, count, backward, merged, &ws_.merge);
  }
  times.exchange = mt.exchange * 1e3, times.merge = mt.merge * 1e3;
}

// Initial states of the local call [N_local,HV,..] on the device: the merged state for a continuing
// first sequence (expand_h0), the given h0 for sequences that start here; empty when all would be zero.
TensorView ContextParallel::local_initial_states(const Local& l, const Inputs& in) {
  const CpContext& c = ctx_;
  if (c.empty() || (in.initial_state.empty() && c.is_first_rank)) return {};
  Queue& q = backend_.queue();
  const TensorView h = ws_.h0.reuse(q, l.p.compute, global_state_shape(l.p, c.n_local()));
  q.fill_zero(h);
  const int64_t first_own = c.is_first_rank ? 0 : 1;  // local sequences that start here: [first_own, n_local)
  if (!c.is_first_rank) q.copy_view(state_entry_kmajor(h, 0, flags_.state_v_first), saved_h0_.view);
  if (!in.initial_state.empty() && c.n_local() > first_own)
    q.copy_view(h.narrow(0, first_own, c.n_local() - first_own),
                in.initial_state.narrow(0, c.seq_begin + first_own, c.n_local() - first_own));
  return h;
}

namespace {
// While alive (and `on`), the backend may take every call's inputs as unchanged since its previous
// call (Backend::set_inputs_unchanged): around a rank's local pass right after its transition or
// prepare on the same views, with nothing but the exchange (this layer's own buffers) in between.
// Off again at the end of the scope, also when the pass throws.
class InputsUnchanged {
 public:
  InputsUnchanged(Backend& b, bool on) : b_(b), on_(on) {
    if (on_) b_.set_inputs_unchanged(true);
  }
  ~InputsUnchanged() {
    if (on_) b_.set_inputs_unchanged(false);
  }
  InputsUnchanged(const InputsUnchanged&) = delete;
  InputsUnchanged& operator=(const InputsUnchanged&) = delete;

 private:
  Backend& b_;
  bool on_;
};

// Global state view: entries [seq_begin + own_lo, seq_begin + own_hi) from the local view, zero elsewhere.
void scatter_states(Queue& q, const CpContext& c, const TensorView& global, const TensorView& local, int64_t own_lo,
                    int64_t own_hi) {
  if (global.empty()) return;
  q.fill_zero(global);
  if (own_hi > own_lo) q.copy_view(global.narrow(0, c.seq_begin + own_lo, own_hi - own_lo), local.narrow(0, own_lo, own_hi - own_lo));
}
}  // namespace

void ContextParallel::forward_impl(const Local& l, const Inputs& in, const Outputs& out) {
  const CpContext& c = ctx_;
  const Problem& p = l.p;
  Queue& q = backend_.queue();
  const int64_t last = c.n_local() - 1;
  Inputs loc = in;
  loc.initial_state = {};
  const TensorView mine = ws_.mine.reuse(q, p.compute, transition_shape(1, p.HV, p.K, p.V));
  have_m_ = false;
  // The last rank has no transition to run: the local forward's stages that do not read the initial
  // state run while the other ranks run theirs (timed as local work; one rank waits for no one).
  double prepare_ms = 0;
  bool called = false;  // the backend took loc's views in this call already
  if (c.is_last_rank && !c.is_first_rank && !c.empty())
    phase(prepare_ms, [&] {
      backend_.forward_prepare(p, loc);
      called = true;
    });
  phase(fwd_times_.transition, [&] {
    if (c.empty()) return q.transition_identity(element(mine));
    if (c.is_last_rank) return q.fill_zero(mine);  // a reset with a zero state: no one folds it
    // the last local sequence continues (the backend may keep its front stages, as prepare does)
    backend_.transition_forward(p, loc, last, mine);
    called = true;
    if (c.n_local() == 1) {  // it is also the first: its backward transition takes M^T from here
      q.copy_view(saved_m_.reuse(q, p.compute, {p.HV, p.K, p.K}), transition_m(element(mine)));
      have_m_ = true;
    }
    if (c.starts_here(last))  // the run starts at its h0 (5.7) and nothing before it reaches past
      q.transition_start(element(mine), in.initial_state.empty() ? TensorView()
                                                                 : state_entry_kmajor(in.initial_state, c.seq_begin + last,
                                                                                      flags_.state_v_first));
  });
  if (c.is_first_rank) saved_h0_ = DeviceTensor();
  else saved_h0_.reuse(q, p.compute, {p.HV, p.K, p.V});
  exchange_and_merge(mine, false, saved_h0_.view, fwd_times_);
  phase(fwd_times_.local, [&] {
    TensorView ht_local;
    if (!c.empty()) {
      loc.initial_state = local_initial_states(l, in);
      if (!out.final_state.empty()) ht_local = ws_.ht.reuse(q, out.final_state.dtype, global_state_shape(p, c.n_local()));
      const InputsUnchanged same(backend_, called);
      backend_.forward(p, loc, {out.o, ht_local});
    }
    // final states of the sequences that end here: all but a continuing last one
    scatter_states(q, c, out.final_state, ht_local, 0, c.is_last_rank ? c.n_local() : c.n_local() - 1);
    q.synchronize();  // the call's results are complete when it returns
  });
  fwd_times_.local += prepare_ms;
}

void ContextParallel::reduce_parameter_grads(const Local& l, const TensorView& dA, const TensorView& ddt,
                                             const Grads& gr) {
  Queue& q = backend_.queue();
  (void)l;
  for (auto [part, view] : {std::pair{dA, gr.dA_log}, std::pair{ddt, gr.ddt_bias}}) {
    if (view.empty()) continue;
    q.synchronize();
    comm_.all_reduce_sum(part.data, part.numel(), part.dtype);
    q.copy_view(view, part);
  }
  q.synchronize();
}

// The backward transition (dS_ext, M^T) of local sequence 0 into mine. The M^T chain costs as much
// as the dS_ext chain; it is not run where M^T is known or unread: M of a rank holding one sequence
// was kept by the forward (saved_m_; backward runs on the forward's inputs, as saved_h0_ already
// requires), and a run that stops here with no d_final_state has its M^T zeroed unread by
// transition_start. Then the backend computes dS_ext alone.
void ContextParallel::backward_transition(const Problem& p, const Inputs& loc, const Cotangents& d, const TensorView& mine) {
  const CpContext& c = ctx_;
  Queue& q = backend_.queue();
  const bool m_unread = c.ends_here(0) && d.d_final_state.empty();
  const bool m_kept = have_m_ && saved_m_.view.shape == Shape{p.HV, p.K, p.K} && saved_m_.view.dtype == p.compute;
  if (!m_unread && !m_kept) return backend_.transition_backward(p, loc, d.d_o, 0, mine);
  const TensorView ds = ws_.ds.reuse(q, p.compute, transition_s_shape(1, p.HV, p.K, p.V));
  backend_.transition_backward(p, loc, d.d_o, 0, ds);
  const TensorView e = element(mine);
  q.copy_view(transition_s(e), transition_element(ds, 0));
  if (m_unread) q.fill_zero(transition_m(e));
  else q.copy_view(transition_m(e), transposed_kk(saved_m_.view));
}

void ContextParallel::backward_impl(const Local& l, const Inputs& in, const Cotangents& d, const Grads& gr) {
  const CpContext& c = ctx_;
  const Problem& p = l.p;
  Queue& q = backend_.queue();
  const int64_t last = c.n_local() - 1;
  Inputs loc = in;
  loc.initial_state = local_initial_states(l, in);  // expand_h0
  const TensorView mine = ws_.mine.reuse(q, p.compute, transition_shape(1, p.HV, p.K, p.V));
  // The first rank has no transition to run: the local backward's d_o-only stages run while the other
  // ranks run theirs (timed as local work; with one rank there is no one to wait for).
  double prepare_ms = 0;
  bool called = false;  // the backend took loc's views and d_o in this call already
  if (c.is_first_rank && !c.is_last_rank && !c.empty())
    phase(prepare_ms, [&] {
      backend_.backward_prepare(p, loc, d.d_o);
      called = true;
    });
  phase(bwd_times_.transition, [&] {
    if (c.empty()) return q.transition_identity(element(mine));
    if (c.is_first_rank) return q.fill_zero(mine);
    // the first local sequence continues (the backend may keep its d_o-only stages for the local
    // backward, as prepare does)
    backward_transition(p, loc, d, mine);
    called = true;
    if (c.ends_here(0))  // dht folded in (5.7), and the chain stops here
      q.transition_start(element(mine), d.d_final_state.empty()
                                            ? TensorView()
                                            : state_entry_kmajor(d.d_final_state, c.seq_begin, flags_.state_v_first));
  });
  const TensorView merged = c.is_last_rank ? TensorView() : ws_.merged.reuse(q, p.compute, {p.HV, p.K, p.V});
  exchange_and_merge(mine, true, merged, bwd_times_);
  const TensorView dA = ws_.dA.reuse(q, p.compute, {p.HV});
  const TensorView ddt = ws_.ddt.reuse(q, p.compute, gr.ddt_bias.empty() ? Shape{0} : gr.ddt_bias.shape);
  phase(bwd_times_.local, [&] {
    TensorView dht_local, dh0_local;
    if (!c.empty()) {
      if (!d.d_final_state.empty() || !c.is_last_rank) {
        dht_local = ws_.dht.reuse(q, p.compute, global_state_shape(p, c.n_local()));
        q.fill_zero(dht_local);
        const int64_t own_hi = c.is_last_rank ? c.n_local() : c.n_local() - 1;  // sequences that end here
        if (!d.d_final_state.empty() && own_hi > 0)
          q.copy_view(dht_local.narrow(0, 0, own_hi), d.d_final_state.narrow(0, c.seq_begin, own_hi));
        if (!c.is_last_rank) q.copy_view(state_entry_kmajor(dht_local, last, flags_.state_v_first), merged);
      }
      if (!gr.d_initial_state.empty())
        dh0_local = ws_.dh0.reuse(q, gr.d_initial_state.dtype, global_state_shape(p, c.n_local()));
      Grads lg = gr;
      lg.d_initial_state = dh0_local;
      lg.dA_log = gr.dA_log.empty() ? TensorView() : dA;
      lg.ddt_bias = gr.ddt_bias.empty() ? TensorView() : ddt;
      const InputsUnchanged same(backend_, called);
      backend_.backward(p, loc, {d.d_o, dht_local}, lg);
    } else {
      q.fill_zero(dA), q.fill_zero(ddt);
    }
    // initial-state gradients of the sequences that start here: all but a continuing first one
    scatter_states(q, c, gr.d_initial_state, dh0_local, c.is_first_rank ? 0 : 1, c.n_local());
    q.synchronize();
  });
  bwd_times_.local += prepare_ms;
  phase(bwd_times_.reduce, [&] { reduce_parameter_grads(l, dA, ddt, gr); });
}

void ContextParallel::forward(const Inputs& in, const Outputs& out) {
  fwd_times_ = {};
  const auto t = Clock::now();
  std::string config, err;
  std::optional<Local> l;
  try {
    l = prepare(in, config);
    check_outputs(l->p, {nonnull(out.o), {}});
    expect_global_state("final_state", out.final_state, global_state_shape(l->p, l->N), backend_.device());
    config += " ht=" + shape_for_hash(out.final_state, false);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm_.control(), "cp forward", config, err);
  if (opt_.timing) fwd_times_.check = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  forward_impl(*l, in, out);
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
    expect_global_state("dht", d.d_final_state, st, backend_.device());
    expect_global_state("d_initial_state", gr.d_initial_state, st, backend_.device());
    KCP_CHECK(gr.d_initial_state.empty() || !in.initial_state.empty(),
              "d_initial_state: requested, but initial_state was not given");
    check_cotangents(l->p, {nonnull(d.d_o), {}});
    Grads local = gr;
    local.d_initial_state = {};
    check_grads(l->p, in, local);
    config += " dht=" + shape_for_hash(d.d_final_state, false) + " do=" + shape_for_hash(d.d_o, true);
    for (const TensorView* g : {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.d_initial_state, &gr.dA_log, &gr.ddt_bias})
      config += given(*g) ? "1" : "0";
    const Support bw = backend_.supports_backward(l->p);
    KCP_CHECK(bw.ok, "cp backward: ", backend_.name(), ": ", bw.reason);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm_.control(), "cp backward", config, err);
  if (opt_.timing) bwd_times_.check = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  backward_impl(*l, in, d, gr);
}

}  // namespace kcp::cp
