// gla's plain forward of one sequence with its chain walked as two halves at once
// (cuda::Pipeline::set_gla_halves, cuda/chunk_state_gla_halves.cu): the second half's states from 0,
// corrected in the output by the first half's final state decayed per key, and the final state
// likewise. Not the unsplit chain's arithmetic (the correction's sum and the decay's product round
// differently), so both the split and the unsplit forward are held to the float64 oracle under the
// forward test's bars (validation/tolerance.h: kCudaTf32 for o and the final state in float32,
// kFlaChunkOutput for o in 16 bits), over bf16 / f16 inputs, o in both dtypes, halves of one chunk
// up to 36, short last chunks, with and without h0 and the final state, state_v_first, the fused gate
// and L2 norm, and K / V of 32 to 128. A packed batch (several sequences) and float32 inputs run
// unsplit whatever is asked. Outputs NaN-poisoned first. Skipped where no CUDA device is present.
// The backward in halves (its recompute and its dh chain) against the oracle's gradients; the kept
// forward and the backward's recompute in halves bit for bit: test_cuda_keep.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

using HalvesCase = test::DtypeOCase;

std::vector<HalvesCase> cases(uint64_t seed) {
  struct Shape { int64_t T, K, V; };
  const Shape shapes[] = {{128, 64, 64}, {64 * 9 + 17, 64, 64}, {64 * 72 - 5, 128, 128}, {300, 32, 96}, {65, 128, 64}};
  std::vector<HalvesCase> out;
  int i = 0;
  for (const Shape& sh : shapes) {
    HalvesCase c;
    val::CaseSpec& s = c.spec;
    s.variant = Variant::gla;
    s.B = 1, s.H = 2, s.HV = 2, s.T = sh.T, s.K = sh.K, s.V = sh.V;
    s.initial_state = i != 1, s.final_state = i != 2;
    s.flags.state_v_first = i == 3;
    if (i == 4) s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
    s.seed = seed + uint64_t(i);
    c.qkv = i % 2 ? DType::f16 : DType::bf16;
    c.o = i % 3 == 2 ? c.qkv : DType::f32;
    out.push_back(c);
    ++i;
  }
  return out;
}

void check_forward(Backend& gpu, cuda::Pipeline& pipe, const val::CaseData& c, const HalvesCase& hc,
                   const val::OutputSet<double>& ref, const std::string& label) {
  const Problem p = c.problem(DType::f32);
  const test::DeviceInputs din = test::upload_inputs(gpu, c, hc.qkv);
  test::DeviceTensor o = test::poisoned(gpu, hc.o, shape_v(p)), ht;
  if (hc.spec.final_state) ht = test::poisoned(gpu, DType::f32, shape_state(p));
  pipe.forward(p, din.views, {o.view, ht.view});
  const double bar_o = hc.o == DType::f32 ? val::tol::kCudaTf32 : val::tol::kFlaChunkOutput;
  test::check_rel_l2("o", hc.name() + label, test::to_host(gpu, o.view), ref.o.view(), bar_o);
  if (hc.spec.final_state)
    test::check_rel_l2("final_state", hc.name() + label, test::to_host(gpu, ht.view), ref.final_state.view(),
                       val::tol::kCudaTf32);
}

}  // namespace

TEST_CASE("gla forward in halves: the oracle's o and final state" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const HalvesCase& hc : cases(val::seed_from_env(1800))) {
    SUBCASE(hc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(hc.spec), hc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, false);
      cuda::Pipeline split(gpu->queue()), whole(gpu->queue());
      split.set_gla_halves(1);
      whole.set_gla_halves(0);
      check_forward(*gpu, split, c, hc, ref.out, " halves");
      check_forward(*gpu, whole, c, hc, ref.out, " unsplit");
      check_forward(*gpu, split, c, hc, ref.out, " halves again");  // the halves' buffers reused
    }
  }
}

TEST_CASE("gla forward in halves: packed batches and float32 inputs run unsplit" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  HalvesCase packed, f32;
  packed.spec.variant = f32.spec.variant = Variant::gla;
  packed.spec.B = 1, packed.spec.T = 0, packed.spec.seqlens = {200, 1, 0, 130}, packed.spec.H = packed.spec.HV = 2;
  packed.spec.K = packed.spec.V = 64, packed.spec.seed = val::seed_from_env(1850);
  f32.spec.B = 1, f32.spec.T = 333, f32.spec.H = f32.spec.HV = 2, f32.spec.K = f32.spec.V = 64;
  f32.spec.seed = packed.spec.seed + 1, f32.qkv = DType::f32;
  for (const HalvesCase& hc : {packed, f32}) {
    SUBCASE(hc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(hc.spec), hc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, false);
      cuda::Pipeline split(gpu->queue());
      split.set_gla_halves(1);
      if (hc.qkv == DType::f32) {  // split products: the float32 bar
        const Problem p = c.problem(DType::f32);
        const test::DeviceInputs din = test::upload_inputs(*gpu, c, hc.qkv);
        test::DeviceTensor o = test::poisoned(*gpu, DType::f32, shape_v(p));
        test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
        split.forward(p, din.views, {o.view, ht.view});
        test::check_rel_l2("o", hc.name(), test::to_host(*gpu, o.view), ref.out.o.view(), val::tol::kFloatVsDouble);
        test::check_rel_l2("final_state", hc.name(), test::to_host(*gpu, ht.view), ref.out.final_state.view(),
                           val::tol::kFloatVsDouble);
      } else {
        check_forward(*gpu, split, c, hc, ref.out, " (unsplit: several sequences)");
      }
    }
  }
}

// The backward with both chains in halves (the recompute's h and the dh chain, each corrected by its
// consumer or its own kernel) against the float64 oracle at FLA's bars for 16-bit inputs
// (test::fla_chunk_bar), do rounded to the input dtype as FLA gives it.
TEST_CASE("gla backward in halves: the oracle's gradients" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  std::vector<HalvesCase> all = cases(val::seed_from_env(1870));
  for (HalvesCase& hc : all) {
    hc.spec.seed += 100;  // other draws than the forward's
    SUBCASE(hc.name().c_str()) {
      val::CaseData c = test::round_case(val::make_case(hc.spec), hc.qkv);
      for (double& x : c.d_o.vec()) x = round_to(hc.qkv, x);
      const auto ref = val::run_case<double>(*oracle, c, true);
      const Problem p = c.problem(DType::f32);
      const test::DeviceInputs din = test::upload_inputs(*gpu, c, hc.qkv);
      test::DeviceTensor d_o = test::to_device(*gpu, c.d_o, hc.qkv), dht;
      if (!c.dht.empty()) dht = test::to_device(*gpu, c.dht, DType::f32);
      cuda::Pipeline split(gpu->queue());
      split.set_gla_halves(1);
      const test::DeviceGrads dg = test::device_grads(*gpu, ref.grads, hc.qkv);
      split.backward(p, din.views, {d_o.view, dht.view}, dg.views);
      for (const test::DeviceGrad& d : dg.t)
        test::check_rel_l2(d.name, hc.name() + " halves", test::to_host(*gpu, d.t.view), d.want->view(),
                           test::fla_chunk_bar(d.name));
    }
  }
}
