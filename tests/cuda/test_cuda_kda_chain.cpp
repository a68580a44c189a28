// kda's plain forward with its state chain transposed (cuda/chunk_state_kda.cu, Pipeline::set_kda_chain):
// the state in wgmma accumulators, 64 value columns per block, against the float64 oracle under the
// forward test's bars (validation/tolerance.h: kCudaTf32 for o and the final state in float32,
// kFlaChunkOutput for o in 16 bits), and chunk_state.cu's chain (set_kda_chain(false)) held to the same
// bars on the same inputs, so a failure says which chain lost. Cases: bf16 / f16 inputs, o in both
// dtypes, K = 64 and 128, V = 64 and 128, short last chunks, sequences of one chunk and of 72 (both
// buffers of the chain's copies in turn), with and without h0 and the final state, state_v_first, the
// fused gate, L2 norm and beta sigmoid with negative eigenvalues, grouped value heads, and a packed
// batch with empty and one-token sequences. Shapes the chain does not take (V = 96, K = 32, float32
// inputs) run chunk_state.cu's: kda_chain_used() says which ran, so no case passes by never taking
// the new chain. The same forward in windows of 3 chunks (Pipeline::set_kda_window: each window's kkt
// and WY beside the chain), in both modes (the chain in one launch waiting on the fronts' signals, and,
// with one multiprocessor assumed, a chain launch per window with the state carried between), must
// give the unwindowed chain's o and final state bit for bit, twice in a row (the signals' epochs), and
// ran in the windows and mode expected (none where the transposed chain does not run). Two pipelines'
// windowed forwards in flight at once (the stream held by a host function): the second runs a chain
// launch per window instead of a second spinning chain beyond the limit (cuda/spinning_chains.h), with
// its one-launch bits. Outputs NaN-poisoned first. Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

struct ChainCase {
  test::DtypeOCase dc;
  bool chain = true;  // whether the shape takes the transposed chain
};

std::vector<ChainCase> cases(uint64_t seed) {
  struct Shape { int64_t T, K, V; };
  const Shape shapes[] = {{128, 64, 64}, {64 * 9 + 17, 128, 128}, {64 * 72 - 5, 128, 128}, {300, 64, 128},
                          {65, 128, 64},  {40, 128, 128},         {200, 128, 96},          {130, 32, 64}};
  std::vector<ChainCase> out;
  int i = 0;
  for (const Shape& sh : shapes) {
    ChainCase c;
    val::CaseSpec& s = c.dc.spec;
    s.variant = Variant::kda;
    s.B = 1, s.H = 2, s.HV = i == 3 ? 4 : 2, s.T = sh.T, s.K = sh.K, s.V = sh.V;
    s.initial_state = i != 1, s.final_state = i != 2;
    s.flags.state_v_first = i == 3;
    if (i == 4) {
      s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
      s.flags.use_beta_sigmoid_in_kernel = s.flags.allow_neg_eigval = true;
    }
    s.seed = seed + uint64_t(i);
    c.dc.qkv = i % 2 ? DType::f16 : DType::bf16;
    c.dc.o = i % 3 == 2 ? c.dc.qkv : DType::f32;
    c.chain = sh.V % 64 == 0 && (sh.K == 64 || sh.K == 128);
    out.push_back(c);
    ++i;
  }
  ChainCase packed;
  packed.dc.spec.variant = Variant::kda;
  packed.dc.spec.B = 1, packed.dc.spec.T = 0, packed.dc.spec.seqlens = {200, 1, 0, 130};
  packed.dc.spec.H = packed.dc.spec.HV = 2, packed.dc.spec.K = packed.dc.spec.V = 64, packed.dc.spec.seed = seed + 20;
  out.push_back(packed);
  ChainCase f32 = packed;
  f32.dc.spec.seqlens = {}, f32.dc.spec.T = 333, f32.dc.spec.seed = seed + 21, f32.dc.qkv = DType::f32, f32.chain = false;
  out.push_back(f32);
  return out;
}

struct Got {
  Tensor<double> o, ht;
};

Got check_forward(Backend& gpu, cuda::Pipeline& pipe, const val::CaseData& c, const ChainCase& cc,
                  const val::OutputSet<double>& ref, bool chain, const std::string& label) {
  const Problem p = c.problem(DType::f32);
  const test::DeviceInputs din = test::upload_inputs(gpu, c, cc.dc.qkv);
  test::DeviceTensor o = test::poisoned(gpu, cc.dc.o, shape_v(p)), ht;
  if (cc.dc.spec.final_state) ht = test::poisoned(gpu, DType::f32, shape_state(p));
  pipe.forward(p, din.views, {o.view, ht.view});
  CHECK_MESSAGE(pipe.kda_chain_used() == chain, cc.dc.name(), label);
  // float32 inputs: split products, the float32 rule
  const double bar_f = cc.dc.qkv == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
  const double bar_o = cc.dc.o == DType::f32 ? bar_f : val::tol::kFlaChunkOutput;
  Got got{test::to_host(gpu, o.view), {}};
  test::check_rel_l2("o", cc.dc.name() + label, got.o, ref.o.view(), bar_o);
  if (cc.dc.spec.final_state) {
    got.ht = test::to_host(gpu, ht.view);
    test::check_rel_l2("final_state", cc.dc.name() + label, got.ht, ref.final_state.view(), bar_f);
  }
  return got;
}

}  // namespace

TEST_CASE("kda forward, transposed chain: the oracle's o and final state" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const ChainCase& cc : cases(val::seed_from_env(1900))) {
    SUBCASE(cc.dc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(cc.dc.spec), cc.dc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, false);
      cuda::Pipeline chain(gpu->queue()), plain(gpu->queue());
      chain.set_kda_chain(true);
      plain.set_kda_chain(false);
      check_forward(*gpu, chain, c, cc, ref.out, cc.chain, " transposed chain");
      check_forward(*gpu, plain, c, cc, ref.out, false, " chunk_state chain");
      check_forward(*gpu, chain, c, cc, ref.out, cc.chain, " transposed chain again");  // workspace reused
    }
  }
}

TEST_CASE("kda forward, transposed chain in windows: the unwindowed chain bit for bit" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  constexpr int kWindow = 3;  // chunks: sequences cross windows, and the packed case's empty one sits inside one
  for (const ChainCase& cc : cases(val::seed_from_env(1900))) {
    SUBCASE(cc.dc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(cc.dc.spec), cc.dc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, false);
      cuda::Pipeline whole(gpu->queue());
      whole.set_kda_window(0);
      const Got a = check_forward(*gpu, whole, c, cc, ref.out, cc.chain, " unwindowed");
      CHECK(whole.kda_windows_used() == 0);
      const int64_t expect = cc.chain ? (test::cuda_chunk_count(c.problem(DType::f32)) + kWindow - 1) / kWindow : 0;
      // the device's multiprocessors: the chain in one launch waiting on the fronts' signals (its few
      // blocks leave room); one assumed: a chain launch per window, the state carried between them
      for (const int sms : {0, 1}) {
        cuda::Pipeline windowed(gpu->queue());
        windowed.set_kda_window(kWindow);
        windowed.set_multiprocessors(sms);
        const std::string mode = sms ? " windows of 3 chunks, a chain launch per window" : " windows of 3 chunks, one launch";
        const Got b = check_forward(*gpu, windowed, c, cc, ref.out, cc.chain, mode);
        CHECK_MESSAGE(windowed.kda_windows_used() == expect, cc.dc.name(), mode);
        if (expect) {
          CHECK_MESSAGE(windowed.last_forward().chain_per_window == (sms == 1), cc.dc.name(), mode);
          CHECK(windowed.last_forward().describe().find(std::to_string(expect) + " windows of 3 chunks") != std::string::npos);
        }
        CHECK_MESSAGE(a.o.vec() == b.o.vec(), cc.dc.name(), mode, ": o differs from the unwindowed chain's");
        CHECK_MESSAGE(a.ht.vec() == b.ht.vec(), cc.dc.name(), mode, ": the final state differs from the unwindowed chain's");
        check_forward(*gpu, windowed, c, cc, ref.out, cc.chain, mode + " again");  // the signals' next epoch
      }
    }
  }
}

namespace {

// o of a kda forward of `c` (float32, NaN-poisoned: uploads wait for the queue, so before any gate).
test::DeviceTensor output_for(Backend& gpu, const val::CaseData& c) {
  return test::poisoned(gpu, DType::f32, shape_v(c.problem(DType::f32)));
}
// The forward on `pipe` into o, queued only: the caller synchronizes before reading o.
void queue_forward(cuda::Pipeline& pipe, const val::CaseData& c, const test::DeviceInputs& din, const test::DeviceTensor& o) {
  pipe.forward(c.problem(DType::f32), din.views, {o.view, {}});
}

}  // namespace

// Two pipelines' windowed forwards in flight at once (spinning_chains.h): A's one-launch chain holds 8
// blocks; B (2 blocks, 8 multiprocessors assumed: alone it may spin, limit 4) must not add a spinning
// chain beside A's, so it runs a chain launch per window, with the same bits as its one-launch run.
TEST_CASE("kda forward in windows: a second pipeline's one-launch chain waits its turn" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const uint64_t seed = val::seed_from_env(1950);
  auto make = [&](int64_t H, int64_t KV, uint64_t s) {
    val::CaseSpec spec;
    spec.variant = Variant::kda, spec.B = 1, spec.T = 64 * 12, spec.H = spec.HV = H, spec.K = spec.V = KV, spec.seed = s;
    return test::round_case(val::make_case(spec), DType::bf16);
  };
  const val::CaseData ca = make(4, 128, seed), cb = make(2, 64, seed + 1);
  const test::DeviceInputs da = test::upload_inputs(*gpu, ca, DType::bf16), db = test::upload_inputs(*gpu, cb, DType::bf16);
  cuda::Pipeline a(gpu->queue()), b(gpu->queue());
  a.set_kda_window(3), b.set_kda_window(3), b.set_multiprocessors(8);
  // alone (and sized: no buffer grows, so nothing below waits for the stream on the host)
  const test::DeviceTensor oa = output_for(*gpu, ca), ob = output_for(*gpu, cb), oa2 = output_for(*gpu, ca),
                           ob2 = output_for(*gpu, cb), ob3 = output_for(*gpu, cb);
  queue_forward(a, ca, da, oa), queue_forward(b, cb, db, ob);
  gpu->queue().synchronize();
  REQUIRE(a.last_forward().chain_blocks == 8);
  REQUIRE(b.last_forward().chain_blocks == 2);
  REQUIRE(a.kda_windows_used() == 4);  // 12 chunks in windows of 3
  REQUIRE(b.kda_windows_used() == 4);
  CHECK_FALSE(a.last_forward().chain_per_window);
  CHECK_FALSE(b.last_forward().chain_per_window);  // alone, B's chain spins
  {
    test::StreamGate gate(*gpu);  // A's chain stays in flight while B plans
    queue_forward(a, ca, da, oa2);
    queue_forward(b, cb, db, ob2);
    CHECK_FALSE(a.last_forward().chain_per_window);
    CHECK_MESSAGE(b.last_forward().chain_per_window, "B's one-launch chain was admitted beside A's");
  }
  gpu->queue().synchronize();
  CHECK(test::to_host(*gpu, oa.view).vec() == test::to_host(*gpu, oa2.view).vec());
  CHECK_MESSAGE(test::to_host(*gpu, ob.view).vec() == test::to_host(*gpu, ob2.view).vec(),
                "B's o a chain launch per window differs from its one-launch o");
  queue_forward(b, cb, db, ob3);  // A finished: B spins again
  gpu->queue().synchronize();
  CHECK_FALSE(b.last_forward().chain_per_window);
  CHECK(test::to_host(*gpu, ob.view).vec() == test::to_host(*gpu, ob3.view).vec());
}
