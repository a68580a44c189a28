// Multi-rank tests (run by ctest under mpirun, 4 ranks): the MPI communicator's collectives, the
// log-depth scan against the linear fold (resets, identities, both directions), the two merges
// through the whole CP layer, and the refusals: ranks that disagree on the configuration, a rank with
// a bad local input, partitions that do not match cu_seqlens, backward before forward. Every refusal
// must reach every rank as an exception before the backend computes anything. And which ranks ask the
// backend to prepare a local pass while they wait (and vouch for its inputs around the local pass), and a ContextParallel called a second time on other
// inputs (the buffers it keeps; a planted stale all-gather buffer, or a scan that skips its first
// copy into a kept buffer, each fails 16 of its 36 checks).
#include <doctest/doctest.h>

#include <string>

#include "core/rng.h"
#include "core/transition.h"
#include "cp/comm_device.h"
#include "cp/context_parallel.h"
#include "cp/merge.h"
#include "app/cp_sweep_run.h"
#include "tests/cp/mpi_world.h"
#include "core/forwarding_backend.h"
#include "validation/compare.h"
#include "validation/registry.h"
#include "validation/tolerance.h"

using namespace kcp;
using doctest::Contains;

namespace {

// Counts the backend calls that compute, so a refused call can be shown to have computed nothing.
class CountingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int calls = 0;
  void forward(const Problem& p, const Inputs& in, const Outputs& o) override {
    ++calls, ForwardingBackend::forward(p, in, o);
  }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    ++calls, ForwardingBackend::backward(p, in, d, g);
  }
  void transition_forward(const Problem& p, const Inputs& in, int64_t s, const TensorView& t) override {
    ++calls, ForwardingBackend::transition_forward(p, in, s, t);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t s,
                           const TensorView& t) override {
    ++calls, ForwardingBackend::transition_backward(p, in, d_o, s, t);
  }
};

// Rank j's element [1,HV,K,V+K]: an identity for an "empty rank", a reset (M = 0) for a rank where
// a sequence starts, random otherwise.
template <class S>
Tensor<S> element(int j, int64_t HV, int64_t K, int64_t V, uint64_t seed) {
  Tensor<S> a(transition_shape(1, HV, K, V));
  const TensorView e = transition_element(a.view(), 0);
  if (j % 5 == 3) return host_queue().transition_identity(e), a;
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = S(CounterRng{seed + uint64_t(j), 3}.normal(uint64_t(i)) * 0.4);
  if (j % 3 == 1) host_queue().transition_start(e, {});
  return a;
}

double rel(const TensorView& a, const TensorView& b) { return val::compare(a, b).rel_l2; }

// Every tensor of got within the float64 exactness bar of want's (the same tensors, in order; rel_l2
// against want).
void check_exact(const app::NamedViews& got, const app::NamedViews& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    CHECK(rel(got[i].second, want[i].second) <= val::tol::kExactF64);
  }
}

val::CaseSpec spec_for(Variant var, int P) {
  val::CaseSpec s;
  s.variant = var, s.H = 1, s.HV = 2, s.K = s.V = 8, s.chunk_size = 16;
  s.seqlens = {3, 9 * P + 4, 5, 1};  // the long one spans every rank
  s.seed = val::seed_from_env(0) + 17;
  return s;
}

}  // namespace

TEST_CASE("mpi comm: all_gather, all_reduce, send_recv ring and split") {
  cp::Comm& w = test::world();
  const int r = w.rank(), P = w.size();
  const int64_t mine[2] = {r, 10 * r};
  std::vector<int64_t> all(size_t(2 * P));
  cp::all_gather(w, mine, all.data(), 2);
  for (int j = 0; j < P; ++j) CHECK((all[size_t(2 * j)] == j && all[size_t(2 * j + 1)] == 10 * j));
  double x[2] = {double(r), -double(r)};
  cp::all_reduce_sum(w, x, 2);
  CHECK(x[0] == double(P * (P - 1) / 2));
  float m = float(r);
  cp::all_reduce_max(w, &m, 1);
  CHECK(m == float(P - 1));
  double got = -1, send = 100.0 + r;
  w.send_recv(&send, (r + 1) % P, &got, (r + P - 1) % P, 1, DType::f64, 7);
  CHECK(got == 100.0 + (r + P - 1) % P);
  auto half = w.split(r % 2);
  CHECK(half->size() == (P + 1 - r % 2) / 2);
  CHECK(half->rank() == r / 2);
  w.barrier();
}

// The staged communicator's host-controlled part (cp/comm_host_controlled.h, shared with the NCCL
// one): rank, size and control() are the host communicator's; a split is a staged communicator over
// the host's split (reducing over its own ranks alone) that owns that split; barriers pass.
TEST_CASE("staged comm: rank, size, control and split forward to the host communicator") {
  cp::Comm& w = test::world();
  const int r = w.rank(), P = w.size();
  const std::unique_ptr<cp::Comm> staged = cp::make_staged_comm(w, host_queue());
  CHECK(staged->rank() == r);
  CHECK(staged->size() == P);
  CHECK(&staged->control() == &w);
  const std::unique_ptr<cp::Comm> half = staged->split(r % 2);
  CHECK(half->name() == staged->name());
  CHECK(half->size() == (P + 1 - r % 2) / 2);
  CHECK(half->rank() == r / 2);
  CHECK(&half->control() != &w);
  double x = 1.0 + r, want = 0;
  for (int j = r % 2; j < P; j += 2) want += 1.0 + j;
  cp::all_reduce_sum(*half, &x, 1);
  CHECK(x == want);
  half->barrier();
  staged->barrier();
}

// Both merges through a communicator: plain MPI, and MPI staged through the queue's host buffers
// (cp/comm_device.h; on the host queue, so the staging logic runs in CI without a GPU).
TEST_CASE("log-depth scan equals the linear fold, forward and backward, with resets and identities") {
  cp::Comm& w = test::world();
  const int r = w.rank(), P = w.size();
  const int64_t HV = 2, K = 4, V = 3;
  const uint64_t seed = val::seed_from_env(0) + 5;
  const std::unique_ptr<cp::Comm> staged = cp::make_staged_comm(w, host_queue());
  for (cp::Comm* c : {&w, staged.get()}) {
    SUBCASE(std::string(c->name()).c_str()) {
      const Tensor<double> mine = element<double>(r, HV, K, V, seed);
      Tensor<double> fold_f({HV, K, V}), fold_b({HV, K, V}), scan_f({HV, K, V}), scan_b({HV, K, V});
      cp::merge_linear(*c, host_queue(), mine.view(), 0, r, false, fold_f.view());          // oldest first
      cp::merge_linear(*c, host_queue(), mine.view(), r + 1, P - 1 - r, true, fold_b.view());  // farthest first
      cp::merge_log_depth(*c, host_queue(), mine.view(), false, scan_f.view());
      cp::merge_log_depth(*c, host_queue(), mine.view(), true, scan_b.view());
      CHECK(rel(scan_f.view(), fold_f.view()) <= val::tol::kExactF64);
      CHECK(rel(scan_b.view(), fold_b.view()) <= val::tol::kExactF64);
      Tensor<float> f32({HV, K, V});
      cp::merge_log_depth(*c, host_queue(), element<float>(r, HV, K, V, seed).view(), false, f32.view());
      CHECK(rel(f32.view(), fold_f.view()) <= val::tol::kFloatVsDouble);
    }
  }
}

TEST_CASE("linear and log-depth merges agree through the CP layer (h0, ht, uneven parts)") {
  cp::Comm& w = test::world();
  auto be = val::backend_create("cpu-recurrent");
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla}) {
    const val::CaseSpec s = spec_for(var, w.size());
    SUBCASE(s.name().c_str()) {
      const val::CaseData c = val::make_case(s);
      std::vector<int64_t> bounds = cp::equal_bounds(c.cu_seqlens.back(), w.size());
      if (w.size() > 2) bounds[2] = bounds[1];  // rank 1 holds nothing
      const auto a = app::run_cp_case<double>(w, *be, c, bounds, cp::MergeAlgorithm::linear);
      const auto b = app::run_cp_case<double>(w, *be, c, bounds, cp::MergeAlgorithm::log_depth);
      check_exact(b.named(), a.named());
    }
  }
}

// One ContextParallel called twice: first on other inputs (another seed: other q .. dht), then on the
// case's. The buffers it keeps between calls (ContextParallel::Workspace) must carry nothing of the
// first call into the second: the second equals the single-process oracle, with h0 / ht, an empty
// rank and both merges.
TEST_CASE("a ContextParallel called again on other inputs gives the single-process result") {
  cp::Comm& w = test::world();
  auto be = val::backend_create("cpu-recurrent");
  for (Variant var : {Variant::gdn, Variant::kda})
    for (cp::MergeAlgorithm merge : {cp::MergeAlgorithm::linear, cp::MergeAlgorithm::log_depth}) {
      const val::CaseSpec s = spec_for(var, w.size());
      SUBCASE((s.name() + " " + std::string(cp::merge_name(merge))).c_str()) {
        val::CaseSpec other = s;
        other.seed += 1000;
        const val::CaseData c = val::make_case(s), first = val::make_case(other);
        std::vector<int64_t> bounds = cp::equal_bounds(c.cu_seqlens.back(), w.size());
        if (w.size() > 2) bounds[2] = bounds[1];  // rank 1 holds nothing
        const auto got = app::run_cp_case<double>(w, *be, c, bounds, merge, true, &first);
        const app::SweepReference ref = app::sweep_reference(c, *be);
        check_exact(got.named(), ref.named());
      }
    }
}

// Records the width (last axis) of every transition_backward buffer: V + K for (dS_ext, M^T), V for
// dS_ext alone.
class WidthSpy final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<int64_t> widths;
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t s,
                           const TensorView& t) override {
    widths.push_back(t.dim(3)), ForwardingBackend::transition_backward(p, in, d_o, s, t);
  }
};

// A rank whose part is one sequence continuing from the previous rank asks for dS_ext alone (M^T
// from its forward transition, or none where the run stops with no d_final_state), and the CP
// gradients still equal the single-process oracle's.
TEST_CASE("a rank holding one continuing sequence computes dS_ext alone; the gradients stay exact") {
  cp::Comm& w = test::world();
  for (bool dht : {false, true}) {
    WidthSpy be(val::backend_create("cpu-recurrent"));
    val::CaseSpec s = spec_for(Variant::kda, w.size());
    s.seqlens = {12 * w.size() + 5}, s.final_state = dht;  // one sequence over every rank
    const val::CaseData c = val::make_case(s);
    SUBCASE((s.name() + (dht ? " dht" : " no dht")).c_str()) {
      const auto got = app::run_cp_case<double>(w, be, c, cp::equal_bounds(c.cu_seqlens.back(), w.size()),
                                                cp::MergeAlgorithm::linear);
      const app::SweepReference ref = app::sweep_reference(c, be);
      check_exact(got.named(), ref.named());
      if (w.rank() == 0) CHECK(be.widths.empty());  // the first rank has no predecessor to send to
      // middle ranks: M^T from the forward; the last rank ran no forward transition (nothing follows
      // it): with dht it needs M^T (V + K columns), without dht none (V)
      const bool last = w.rank() == w.size() - 1;
      if (w.rank() > 0) {
        REQUIRE(!be.widths.empty());
        CHECK(be.widths.front() == (last && dht ? s.K + s.V : s.V));
      }
    }
  }
}

// Records which ranks ask the backend to prepare: the stages a local pass can run ahead while the
// rank waits for the others' transitions (Backend::forward_prepare, backward_prepare); and the calls
// in order (`log`: P / p prepare, T / t transition, F / B local pass, U / u set_inputs_unchanged on / off).
class PrepareSpy final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int forward_prepares = 0, backward_prepares = 0, forwards = 0;
  std::string log;
  void forward_prepare(const Problem& p, const Inputs& in) override {
    CHECK(forwards == 0);  // ahead of the local forward
    ++forward_prepares, log += 'P', ForwardingBackend::forward_prepare(p, in);
  }
  void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) override {
    CHECK(d_o.shape == shape_v(p));
    ++backward_prepares, log += 'p', ForwardingBackend::backward_prepare(p, in, d_o);
  }
  void forward(const Problem& p, const Inputs& in, const Outputs& o) override {
    ++forwards, log += 'F', ForwardingBackend::forward(p, in, o);
  }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    log += 'B', ForwardingBackend::backward(p, in, d, g);
  }
  void transition_forward(const Problem& p, const Inputs& in, int64_t s, const TensorView& t) override {
    log += 'T', ForwardingBackend::transition_forward(p, in, s, t);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t s,
                           const TensorView& t) override {
    log += 't', ForwardingBackend::transition_backward(p, in, d_o, s, t);
  }
  void set_inputs_unchanged(bool on) override { log += on ? 'U' : 'u', ForwardingBackend::set_inputs_unchanged(on); }
};

// The rank with no forward transition to run (the last) prepares its forward, the one with no
// backward transition (the first) its backward; no other rank does; the results stay exact. And the
// local passes alone run with set_inputs_unchanged on, each right after the same pass's transition or
// prepare on the same views: every rank here calls the backend twice per pass (the long sequence
// spans all ranks), so its log is one of TUFu / PUFu, then tUBu / pUBu; with the sequences cut at the
// rank bounds it calls nothing before its local passes and vouches for nothing: FB.
TEST_CASE("the last rank prepares the local forward, the first the local backward, while they wait") {
  cp::Comm& w = test::world();
  REQUIRE(w.size() > 1);
  PrepareSpy be(val::backend_create("cpu-recurrent"));
  val::CaseSpec s = spec_for(Variant::gdn, w.size());
  const val::CaseData c = val::make_case(s);
  const auto got = app::run_cp_case<double>(w, be, c, cp::equal_bounds(c.cu_seqlens.back(), w.size()),
                                            cp::MergeAlgorithm::linear);
  auto oracle = val::backend_create("cpu-recurrent");
  const app::SweepReference ref = app::sweep_reference(c, *oracle);
  check_exact(got.named(), ref.named());
  CHECK(be.forward_prepares == (w.rank() == w.size() - 1 ? 1 : 0));
  CHECK(be.backward_prepares == (w.rank() == 0 ? 1 : 0));
  const std::string fwd = w.rank() == w.size() - 1 ? "PUFu" : "TUFu", bwd = w.rank() == 0 ? "pUBu" : "tUBu";
  CHECK(be.log == fwd + bwd);
  // Sequences cut at the rank bounds: no transition, no prepare, so nothing to vouch for.
  s.seqlens.assign(size_t(w.size()), 7);
  const val::CaseData cut = val::make_case(s);
  PrepareSpy alone(val::backend_create("cpu-recurrent"));
  app::run_cp_case<double>(w, alone, cut, cp::equal_bounds(cut.cu_seqlens.back(), w.size()), cp::MergeAlgorithm::linear);
  CHECK(alone.log == "FB");
}

TEST_CASE("ranks that disagree on the configuration are stopped before any computation") {
  cp::Comm& w = test::world();
  CountingBackend be(val::backend_create("cpu-recurrent"));
  const val::CaseData c = val::make_case(spec_for(Variant::gdn, w.size()));
  const int odd = w.size() - 1;
  auto run = [&](const Flags& f, std::vector<int64_t> cu, int64_t chunk) {
    ProblemOptions po;
    po.cu_seqlens = std::move(cu), po.chunk_size = chunk;
    cp::ContextParallel cp(w, be, Variant::gdn, f, {po, cp::equal_bounds(c.cu_seqlens.back(), w.size()), {}});
    Inputs in = c.inputs();
    const int64_t lo = cp.context().lo, n = cp.context().tokens();
    for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) t->data = static_cast<double*>(t->data) + lo * t->stride[1], t->shape[1] = n;
    Tensor<double> o({1, n, 2, 8});
    cp.forward(in, {o.view(), {}});
  };
  Flags odd_flags;
  odd_flags.state_v_first = w.rank() == odd;
  CHECK_THROWS_WITH_AS(run(odd_flags, c.cu_seqlens, 16), Contains("ranks disagree on the configuration"), Error);
  std::vector<int64_t> cu = c.cu_seqlens;
  if (w.rank() == odd) cu[1] += 1;  // a different sequence boundary on one rank
  CHECK_THROWS_WITH_AS(run({}, cu, 16), Contains("ranks disagree"), Error);
  CHECK_THROWS_WITH_AS(run({}, c.cu_seqlens, w.rank() == odd ? 32 : 16), Contains("ranks disagree"), Error);
  CHECK(be.calls == 0);
}

TEST_CASE("ranks holding different parameter values (A_log) are stopped before any computation") {
  cp::Comm& w = test::world();
  CountingBackend be(val::backend_create("cpu-recurrent"));
  val::CaseSpec s = spec_for(Variant::gdn, w.size());
  s.flags.use_gate_in_kernel = true;
  val::CaseData c = val::make_case(s);
  if (w.rank() == w.size() - 1) c.A_log.data()[1] += 1e-12;  // a stale copy on one rank
  ProblemOptions po;
  po.cu_seqlens = c.cu_seqlens;
  cp::ContextParallel cp(w, be, Variant::gdn, s.flags, {po, {}, cp::MergeAlgorithm::linear});
  Inputs in = c.inputs();
  const int64_t lo = cp.context().lo, n = cp.context().tokens();
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta})
    t->data = static_cast<double*>(t->data) + lo * t->stride[1], t->shape[1] = n;
  Tensor<double> o({1, n, 2, 8});
  CHECK_THROWS_WITH_AS(cp.forward(in, {o.view(), {}}), Contains("ranks disagree"), Error);
  CHECK(be.calls == 0);
}

TEST_CASE("a rank with a bad local input stops every rank with its name") {
  cp::Comm& w = test::world();
  CountingBackend be(val::backend_create("cpu-recurrent"));
  const val::CaseData c = val::make_case(spec_for(Variant::kda, w.size()));
  ProblemOptions po;
  po.cu_seqlens = c.cu_seqlens, po.chunk_size = 16;
  cp::ContextParallel cp(w, be, Variant::kda, {}, {po, {}, cp::MergeAlgorithm::linear});
  const int bad = w.size() - 1;
  const int64_t lo = cp.context().lo, n = cp.context().tokens() + (w.rank() == bad ? 1 : 0);  // one token too many
  Inputs in = c.inputs();
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) t->data = static_cast<double*>(t->data) + lo * t->stride[1], t->shape[1] = n;
  Tensor<double> o({1, n, 2, 8});
  if (w.rank() == bad) CHECK_THROWS_WITH_AS(cp.forward(in, {o.view(), {}}), Contains("but q has T_local"), Error);
  const std::string others = "rank " + std::to_string(bad) + " rejected its input";
  if (w.rank() != bad) CHECK_THROWS_WITH_AS(cp.forward(in, {o.view(), {}}), Contains(others.c_str()), Error);
  CHECK(be.calls == 0);
  CHECK_THROWS_WITH_AS(cp.backward(in, {o.view(), {}}, {}), Contains("run forward on the same inputs first"), Error);
  CHECK(be.calls == 0);
}

TEST_CASE("a bad cotangent on one rank stops every rank's backward before any computation") {
  cp::Comm& w = test::world();
  CountingBackend be(val::backend_create("cpu-recurrent"));
  const val::CaseData c = val::make_case(spec_for(Variant::gla, w.size()));
  ProblemOptions po;
  po.cu_seqlens = c.cu_seqlens;
  cp::ContextParallel cp(w, be, Variant::gla, {}, {po, {}, cp::MergeAlgorithm::log_depth});
  const int64_t lo = cp.context().lo, n = cp.context().tokens();
  Inputs in = c.inputs();
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.g})
    t->data = static_cast<double*>(t->data) + lo * t->stride[1], t->shape[1] = n;
  Tensor<double> o({1, n, 2, 8}), d_o({1, n, 2, w.rank() == 0 ? 7 : 8}), dq({1, n, 1, 8});
  cp.forward(in, {o.view(), {}});
  const int calls = be.calls;
  Grads g;
  g.dq = dq.view();
  if (w.rank() == 0) CHECK_THROWS_WITH_AS(cp.backward(in, {d_o.view(), {}}, g), Contains("do: expected shape"), Error);
  else CHECK_THROWS_WITH_AS(cp.backward(in, {d_o.view(), {}}, g), Contains("rank 0 rejected"), Error);
  CHECK(be.calls == calls);
}

TEST_CASE("partitions that do not match cu_seqlens or the rank count are rejected") {
  cp::Comm& w = test::world();
  auto be = val::backend_create("cpu-recurrent");
  ProblemOptions po;
  po.cu_seqlens = {0, 5, 12};
  std::vector<int64_t> bounds = cp::equal_bounds(13, w.size());
  CHECK_THROWS_WITH_AS(cp::ContextParallel(w, *be, Variant::gdn, {}, {po, bounds, {}}),
                       Contains("the parts cover 13 tokens but cu_seqlens ends at T = 12"), Error);
  bounds = cp::equal_bounds(12, w.size() + 1);
  CHECK_THROWS_WITH_AS(cp::ContextParallel(w, *be, Variant::gdn, {}, {po, bounds, {}}), Contains("entries for"), Error);
  po.cu_seqlens = {};
  CHECK_THROWS_WITH_AS(cp::ContextParallel(w, *be, Variant::gdn, {}, {po, {}, {}}), Contains("cu_seqlens (global) is required"),
                       Error);
}

TEST_CASE("more ranks than tokens: empty ranks pass zero-size views and the result is exact") {
  cp::Comm& w = test::world();
  auto be = val::backend_create("cpu-recurrent");
  val::CaseSpec s = spec_for(Variant::gdn, 1);
  s.seqlens = {2, 0, 1};  // 3 tokens: at 4 ranks one rank is empty
  const val::CaseData c = val::make_case(s);
  const Problem p = c.problem();
  auto want = val::make_outputs<double>(p, true);
  be->forward(p, c.inputs(), want.views());
  ProblemOptions po;
  po.cu_seqlens = c.cu_seqlens;
  cp::ContextParallel cp(w, *be, Variant::gdn, {}, {po, {}, {}});
  const int64_t lo = cp.context().lo, n = cp.context().tokens();
  Tensor<double> q({1, n, 1, 8}), k({1, n, 1, 8}), v({1, n, 2, 8}), g({1, n, 2}), beta({1, n, 2}), o({1, n, 2, 8});
  for (auto [local, global] : {std::pair{&q, &c.q}, std::pair{&k, &c.k}, std::pair{&v, &c.v}, std::pair{&g, &c.g},
                                std::pair{&beta, &c.beta}})
    for (int64_t i = 0; i < local->numel(); ++i) local->data()[i] = global->data()[lo * (global->numel() / 3) + i];
  Tensor<double> ht(shape_state(p)), o_all({1, 3, 2, 8});
  cp.forward({q.view(), k.view(), v.view(), g.view(), beta.view(), {}, {}, c.h0.view()}, {o.view(), ht.view()});
  for (int64_t i = 0; i < o.numel(); ++i) o_all.data()[lo * 16 + i] = o.data()[i];
  cp::all_reduce_sum(w, o_all.data(), o_all.numel());
  cp::all_reduce_sum(w, ht.data(), ht.numel());
  CHECK(rel(o_all.view(), want.o.view()) <= val::tol::kExactF64);
  CHECK(rel(ht.view(), want.final_state.view()) <= val::tol::kExactF64);
}
