// run_op_call stages every tensor through the backend's queue (never by name) and returns
// exactly what a direct call gives; run_conv1d_call equals the reference called directly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "io/dump_call.h"
#include "reference/conv1d.h"
#include "tests/io/io_fixtures.h"
#include "core/forwarding_backend.h"
#include "validation/dump_runner.h"
#include "validation/registry.h"

using namespace kcp;

namespace {

// The host queue behind a "device" whose memory is tracked: allocations, uploads and downloads.
class TrackedQueue final : public Queue {
 public:
  ~TrackedQueue() override { CHECK(live.empty()); }
  Device device() const override { return Device::host; }
  std::string describe() const override { return "tracked host"; }
  void* alloc(size_t bytes) override {
    void* p = host_queue().alloc(bytes);
    live.insert(p);
    return p;
  }
  void release(void* p) noexcept override { live.erase(p), host_queue().release(p); }
  void* alloc_host(size_t bytes) override { return host_queue().alloc_host(bytes); }
  void release_host(void* p) noexcept override { host_queue().release_host(p); }
  void copy(void* dst, const void* src, size_t n, CopyKind kind) override {
    uploads += kind == CopyKind::host_to_device, downloads += kind == CopyKind::device_to_host;
    host_queue().copy(dst, src, n, kind);
  }
  void synchronize() override {}
  double time_ms(const std::function<void()>& body) override { return host_queue().time_ms(body); }
  void copy_view(const TensorView& d, const TensorView& s) override { host_queue().copy_view(d, s); }
  void add_view(const TensorView& d, const TensorView& s) override { host_queue().add_view(d, s); }
  void fill_zero(const TensorView& d) override { host_queue().fill_zero(d); }
  void transition_fold(const TensorView& e, int64_t f, int64_t c, bool r, const TensorView& x0,
                       const TensorView& o) override {
    host_queue().transition_fold(e, f, c, r, x0, o);
  }
  void transition_compose(const TensorView& l, const TensorView& e, const TensorView& o) override {
    host_queue().transition_compose(l, e, o);
  }
  void transition_start(const TensorView& t, const TensorView& x0) override { host_queue().transition_start(t, x0); }
  void transition_identity(const TensorView& t) override { host_queue().transition_identity(t); }
  std::set<void*> live;
  int uploads = 0, downloads = 0;
};

// cpu-recurrent on a TrackedQueue: every view the backend sees must be one of the queue's own
// allocations, and every allocation must come back.
class TrackedBackend final : public ForwardingBackend {
 public:
  TrackedBackend() : ForwardingBackend(val::backend_create("cpu-recurrent")) {}
  bool forward_only = false;  // then supports_backward() says no, like a backend without a backward
  Support supports_backward(const Problem& p) const override {
    return forward_only ? Support::no("tracked-recurrent: forward only in this test") : inner().supports(p);
  }
  std::string_view name() const override { return "tracked-recurrent"; }
  Queue& queue() const override { return queue_; }
  void forward(const Problem& p, const Inputs& in, const Outputs& out) override {
    for (const TensorView* v : {&in.q, &in.k, &in.v, &in.g, &in.beta, &out.o, &out.final_state}) owned(*v);
    ForwardingBackend::forward(p, in, out);
  }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& g) override {
    CHECK_FALSE(forward_only);  // the runner must not call a backward the backend disowns
    for (const TensorView* v : {&d.d_o, &g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.d_initial_state}) owned(*v);
    ForwardingBackend::backward(p, in, d, g);
  }
  int uploads() const { return queue_.uploads; }
  int downloads() const { return queue_.downloads; }

 private:
  void owned(const TensorView& v) const {
    if (!v.empty()) CHECK(queue_.live.count(v.data) == 1);
  }
  mutable TrackedQueue queue_;
};

}  // namespace

TEST_CASE("run_op_call stages through alloc/upload/download and equals a direct call") {
  test::TempDir dir("runner");
  val::CaseSpec s;
  s.variant = Variant::kda, s.seqlens = {6, 11}, s.H = 1, s.HV = 2, s.K = 8, s.V = 4;
  s.flags.use_gate_in_kernel = true, s.seed = val::seed_from_env(9);
  const val::CaseData c = val::make_case(s);
  io::dump_write(dir.file("c.h5"), test::dump_from_case(c, DType::f64));
  const io::OpCall call = io::dump_op_call(io::dump_read(dir.file("c.h5")), DType::f64);
  TrackedBackend tracked;
  const val::Results r = val::run_op_call(tracked, call);
  CHECK(tracked.uploads() == 10);   // q k v g beta A_log dt_bias h0, do dht
  CHECK(tracked.downloads() == 10); // o final_state dq dk dv dg dbeta dh0 dA_log ddt_bias
  const Problem p = c.problem();
  auto out = val::make_outputs<double>(p, true);
  auto gr = val::make_grads<double>(p, c.inputs());
  auto direct = val::backend_create("cpu-recurrent");
  direct->forward(p, c.inputs(), out.views());
  direct->backward(p, c.inputs(), c.cotangents(), gr.views());
  const std::pair<const char*, const Tensor<double>*> want[] = {
      {"o", &out.o}, {"final_state", &out.final_state}, {"dq", &gr.dq}, {"dk", &gr.dk}, {"dv", &gr.dv},
      {"dg", &gr.dg}, {"dbeta", &gr.dbeta}, {"dinitial_state", &gr.dh0}, {"dA_log", &gr.dA_log},
      {"ddt_bias", &gr.ddt_bias}};
  for (auto [name, t] : want) {
    INFO(name);
    REQUIRE(r.count(name));
    CHECK(r.at(name).shape == t->shape());
    CHECK(std::memcmp(r.at(name).data(), t->data(), size_t(t->numel()) * sizeof(double)) == 0);
  }
}

TEST_CASE("a dump without do runs the forward pass only") {
  test::TempDir dir("runner_fwd");
  val::CaseSpec s;
  s.seed = val::seed_from_env(10);
  io::Dump d = test::dump_from_case(val::make_case(s));
  std::erase_if(d.groups[0].datasets, [](const io::DumpDataset& x) { return x.name == "do" || x.name == "dht"; });
  io::dump_write(dir.file("f.h5"), d);
  auto be = val::backend_create("cpu-recurrent");
  const val::Results r = val::run_op_call(*be, io::dump_op_call(io::dump_read(dir.file("f.h5")), DType::f32));
  CHECK(r.size() == 2);
  CHECK(r.at("o").dtype == DType::f32);
}

TEST_CASE("run_conv1d_call equals the conv1d reference called directly") {
  io::Conv1dCall c;
  c.path = "mem";
  io::Array& x = c.tensors["x"] = io::Array(DType::f32, {1, 9, 3});
  io::Array& w = c.tensors["weight"] = io::Array(DType::f32, {3, 4});
  io::Array& dy = c.tensors["dy"] = io::Array(DType::f32, {1, 9, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.view().set(i, std::sin(double(i))), dy.view().set(i, std::cos(double(i)));
  for (int64_t i = 0; i < w.numel(); ++i) w.view().set(i, 0.1 * double(i) - 0.5);
  c.x = x.view(), c.weight = w.view(), c.dy = dy.view(), c.cu_seqlens = {0, 2, 9};
  const val::Results r = val::run_conv1d_call(c, DType::f64);
  const auto p = ref::make_conv1d_problem(c.x, c.weight, {}, c.cu_seqlens, true, {});
  Tensor<double> y({1, 9, 3}), dx({1, 9, 3}), dw({3, 4});
  ref::conv1d_forward(p, c.x, c.weight, {}, {}, y.view());
  ref::conv1d_backward(p, c.x, c.weight, {}, {}, c.dy, dx.view(), dw.view(), {}, {});
  CHECK(std::memcmp(r.at("y").data(), y.data(), y.numel() * sizeof(double)) == 0);
  CHECK(std::memcmp(r.at("dx").data(), dx.data(), dx.numel() * sizeof(double)) == 0);
  CHECK(std::memcmp(r.at("dweight").data(), dw.data(), dw.numel() * sizeof(double)) == 0);
  CHECK(r.count("dbias") == 0);
}

TEST_CASE("a backend without a backward: run_dump computes the forward and says why gradients are absent") {
  test::TempDir dir("runner_no_bwd");
  val::CaseSpec s;
  s.variant = Variant::kda, s.seed = val::seed_from_env(11);
  io::dump_write(dir.file("c.h5"), test::dump_from_case(val::make_case(s)));
  TrackedBackend tracked;
  tracked.forward_only = true;
  const val::DumpRun run = val::run_dump(tracked, io::dump_read(dir.file("c.h5")), DType::f64);
  CHECK(run.backward_skipped == "tracked-recurrent: forward only in this test");
  CHECK(run.results.count("o") == 1);
  CHECK(run.results.count("final_state") == 1);
  CHECK(run.results.count("dq") == 0);
  CHECK(run.results.count("dg") == 0);
}
