// Two cuda::Pipeline runs of one staged case compared bit for bit (pipeline_runs.h).
#include "tests/cuda/pipeline_runs.h"

#include <doctest/doctest.h>

#include "validation/compare.h"

namespace kcp::test {

Staged stage(Backend& gpu, const DtypeCase& dc) {
  Staged s{round_case(val::make_case(dc.spec), dc.qkv), {}, {}, {}, {}, {}};
  s.p = s.c.problem(DType::f32);
  s.din = upload_inputs(gpu, s.c, dc.qkv);
  s.d_o = to_device(gpu, s.c.d_o, dc.qkv);
  if (!s.c.dht.empty()) s.dht = to_device(gpu, s.c.dht, DType::f32);
  s.shapes = val::make_grads<double>(s.c.problem(), s.c.inputs());
  return s;
}

Results run_forward(Backend& gpu, cuda::Pipeline& pipe, const Staged& s) {
  DeviceTensor o = poisoned(gpu, DType::f32, shape_v(s.p)), ht;
  if (s.c.spec.final_state) ht = poisoned(gpu, DType::f32, shape_state(s.p));
  pipe.forward(s.p, s.din.views, {o.view, ht.view});
  Results r;
  r.o = to_host(gpu, o.view);
  if (s.c.spec.final_state) r.ht = to_host(gpu, ht.view);
  return r;
}

void run_backward(Backend& gpu, cuda::Pipeline& pipe, const Staged& s, const Inputs& in, DType qkv, Results& r,
                  const TensorView* d_o) {
  const DeviceGrads dg = device_grads(gpu, s.shapes, qkv);
  pipe.backward(s.p, in, {d_o ? *d_o : s.d_o.view, s.dht.view}, dg.views);
  for (const DeviceGrad& d : dg.t) r.grads.emplace_back(d.name, to_host(gpu, d.t.view));
}

void check_same(const std::string& what, const Tensor<double>& a, const Tensor<double>& b, const std::string& name) {
  const val::Metrics m = val::compare(a.view(), b.view());
  INFO(what, " ", name, ": max |a - b| ", m.max_abs, ", NaN ", m.nan_a, " / ", m.nan_b);
  CHECK(m.nan_a == 0);
  CHECK(m.nan_b == 0);
  CHECK(m.max_abs == 0.0);
}

void check_grads_same(const Results& a, const Results& b, const std::string& name) {
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t j = 0; j < a.grads.size(); ++j) check_same(a.grads[j].first, a.grads[j].second, b.grads[j].second, name);
}

}  // namespace kcp::test
