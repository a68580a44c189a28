// The chunk table in closed form (cuda::Pipeline::set_chunk_grid, cuda/chunk_params.cuh chunk_at):
// where every sequence of a call has one length, the kernels compute their chunk's entry instead of
// reading the table. The same entries give the same arithmetic, so o, the final state and every
// gradient must equal the table's bit for bit, for gdn, kda and gla with 16-bit and float32 inputs,
// on B sequences of T tokens (a short last chunk), on packed sequences of one length, and on a packed
// batch of mixed lengths (no closed form: the table, whatever is asked). chunk_grid_used() says which
// path ran, so the test cannot pass by never taking the closed form. The runs and the bit-for-bit
// checks are tests/cuda/pipeline_runs.h's. Skipped without a CUDA device.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "tests/cuda/cuda_support.h"
#include "tests/cuda/pipeline_runs.h"

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

}  // namespace

TEST_CASE("chunk table in closed form: the table's results bit for bit" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  for (const GridCase& g : cases(val::seed_from_env(1900))) {
    SUBCASE(g.dc.name().c_str()) {
      const test::Staged s = test::stage(*gpu, g.dc);
      cuda::Pipeline grid(gpu->queue()), table(gpu->queue());
      grid.set_chunk_grid(true);
      table.set_chunk_grid(false);
      test::Results a = test::run_forward(*gpu, grid, s), b = test::run_forward(*gpu, table, s);
      test::run_backward(*gpu, grid, s, s.din.views, g.dc.qkv, a);
      test::run_backward(*gpu, table, s, s.din.views, g.dc.qkv, b);
      CHECK(grid.chunk_grid_used() == g.closed_form);
      CHECK_FALSE(table.chunk_grid_used());
      test::check_same("o", a.o, b.o, g.dc.name());
      test::check_same("final_state", a.ht, b.ht, g.dc.name());  // every case has one
      test::check_grads_same(a, b, g.dc.name());
    }
  }
}
