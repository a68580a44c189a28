// The chunk table in closed form (cuda::Pipeline::set_chunk_grid, cuda/chunk_params.cuh chunk_at):
// where every sequence of a call has one length, the kernels compute their chunk's entry instead of
// reading the table. The same entries give the same arithmetic, so o, the final state and every
// gradient must equal the table's bit for bit, for gdn, kda and gla with 16-bit and float32 inputs,
// on B sequences of T tokens (a short last chunk), on packed sequences of one length, and on a packed
// batch of mixed lengths (no closed form: the table, whatever is asked). chunk_grid_used() says which
// path ran, so the test cannot pass by never taking the closed form. Skipped without a CUDA device.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/run_case.h"

using namespace kcp;

namespace {

struct GridCase {
  test::DtypeCase dc;
  bool closed_form;  // the layout has one
};

std::vector<GridCase> cases(uint64_t seed) {
  std::vector<GridCase> out;
  int i = 0;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla}) {
    for (int layout = 0; layout < 3; ++layout) {
      GridCase g;
      val::CaseSpec& s = g.dc.spec;
      s.variant = var;
      s.H = 2, s.HV = 2, s.K = 64, s.V = 64, s.seed = seed + uint64_t(i);
      if (layout == 0) s.B = 2, s.T = 130;                                   // B sequences, a 2-row last chunk
      if (layout == 1) s.B = 1, s.T = 0, s.seqlens = {192, 192, 192};        // packed, one length
      if (layout == 2) s.B = 1, s.T = 0, s.seqlens = {200, 1, 0, 130};       // packed, mixed: the table
      s.initial_state = s.final_state = true;
      g.dc.qkv = i % 2 ? DType::f32 : DType::bf16;
      g.closed_form = layout != 2;
      out.push_back(g);
      ++i;
    }
  }
  return out;
}

// Forward (o, final state) and backward (every gradient) on one pipeline, downloaded.
std::vector<Tensor<double>> run(Backend& gpu, cuda::Pipeline& pipe, const val::CaseData& c, const test::DtypeCase& dc,
                                const val::GradSet<double>& shapes) {
  const Problem p = c.problem(DType::f32);
  const test::DeviceInputs din = test::upload_inputs(gpu, c, dc.qkv);
  test::DeviceTensor o = test::poisoned(gpu, DType::f32, shape_v(p)), ht;
  if (dc.spec.final_state) ht = test::poisoned(gpu, DType::f32, shape_state(p));
  pipe.forward(p, din.views, {o.view, ht.view});
  std::vector<Tensor<double>> got = {test::to_host(gpu, o.view)};
  if (dc.spec.final_state) got.push_back(test::to_host(gpu, ht.view));
  test::DeviceTensor d_o = test::to_device(gpu, c.d_o, dc.qkv), dht;
  if (!c.dht.empty()) dht = test::to_device(gpu, c.dht, DType::f32);
  const test::DeviceGrads dg = test::device_grads(gpu, shapes, dc.qkv);
  pipe.backward(p, din.views, {d_o.view, dht.view}, dg.views);
  for (const test::DeviceGrad& d : dg.t) got.push_back(test::to_host(gpu, d.t.view));
  return got;
}

}  // namespace

TEST_CASE("chunk table in closed form: the table's results bit for bit" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const GridCase& g : cases(val::seed_from_env(1900))) {
    SUBCASE(g.dc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(g.dc.spec), g.dc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, true);  // the gradients' shapes
      cuda::Pipeline grid(gpu->queue()), table(gpu->queue());
      grid.set_chunk_grid(true);
      table.set_chunk_grid(false);
      const auto a = run(*gpu, grid, c, g.dc, ref.grads);
      CHECK(grid.chunk_grid_used() == g.closed_form);
      const auto b = run(*gpu, table, c, g.dc, ref.grads);
      CHECK_FALSE(table.chunk_grid_used());
      REQUIRE(a.size() == b.size());
      for (size_t t = 0; t < a.size(); ++t) {
        INFO(g.dc.name(), ": result ", t, " of ", a.size());
        CHECK(a[t].vec() == b[t].vec());  // NaN-poisoned outputs left unwritten would differ too (NaN != NaN)
      }
    }
  }
}
