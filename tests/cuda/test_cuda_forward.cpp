// cuda-chunkwise forward (gdn, kda, gla) against the float64 oracle (cpu-recurrent) over a sweep of lengths (1, 63,
// 64, 65, odd long), dense batches, packed sequences (with empty and length-1 ones), grouped value
// heads, head sizes K = 32/64/128 and V = 32..128, every flag (L2 norm, beta sigmoid, negative
// eigenvalues, softplus and lower-bound gates with and without A_log / dt_bias, state_v_first, no
// h0, no final state, custom scale), q/k/v in float32, float16 and bfloat16, o in float32 or in the
// input dtype. Outputs are NaN-poisoned before each launch: a NaN left means an unwritten element.
// Bars (validation/tolerance.h): float32 inputs kFloatVsDouble; 16-bit inputs kCudaTf32 (o float32
// and final state), kFlaChunkOutput for o stored in 16 bits. Each case prints its errors.
// Skipped (doctest skip, ctest "Skipped") where no CUDA device is present.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/backend_cuda.h"
#include "cuda/fold_layout.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

using GpuCase = test::DtypeOCase;

enum class FlagSet { plain, l2norm, beta_sigmoid, neg_eigval, softplus, softplus_no_dt_bias, lower_bound,
                     lower_bound_no_A_log, v_first, no_h0, no_ht, scale };
constexpr FlagSet kFlagSets[] = {FlagSet::plain, FlagSet::l2norm, FlagSet::beta_sigmoid, FlagSet::neg_eigval,
                                 FlagSet::softplus, FlagSet::softplus_no_dt_bias, FlagSet::lower_bound,
                                 FlagSet::lower_bound_no_A_log, FlagSet::v_first, FlagSet::no_h0,
                                 FlagSet::no_ht, FlagSet::scale};

bool apply(FlagSet f, val::CaseSpec& s) {
  Flags& fl = s.flags;
  switch (f) {
    case FlagSet::plain: break;
    case FlagSet::l2norm: fl.use_qk_l2norm_in_kernel = true; break;
    case FlagSet::beta_sigmoid:
    case FlagSet::neg_eigval:
      if (s.variant == Variant::gla) return false;  // gla has no beta
      fl.use_beta_sigmoid_in_kernel = true, fl.allow_neg_eigval = f == FlagSet::neg_eigval;
      break;
    case FlagSet::softplus: fl.use_gate_in_kernel = true; break;
    case FlagSet::softplus_no_dt_bias: fl.use_gate_in_kernel = true, s.dt_bias = false; break;
    case FlagSet::lower_bound:
    case FlagSet::lower_bound_no_A_log:
      if (s.variant == Variant::gdn) return false;  // the lower-bound gate is per-channel only (kda, gla)
      fl.use_gate_in_kernel = true, fl.lower_bound = -5.0, fl.safe_gate = true;
      s.A_log = f == FlagSet::lower_bound;
      break;
    case FlagSet::v_first: fl.state_v_first = true; break;
    case FlagSet::no_h0: s.initial_state = false; break;
    case FlagSet::no_ht: s.final_state = false; break;
    case FlagSet::scale: s.scale = 0.3; break;
  }
  return true;
}

// Layouts: lengths 1, 63, 64, 65 and odd long ones, batches, packed sequences, GVA, head sizes.
std::vector<val::CaseSpec> layouts() {
  std::vector<val::CaseSpec> v;
  auto add = [&](int64_t B, int64_t T, std::vector<int64_t> lens, int64_t H, int64_t HV, int64_t K, int64_t V) {
    val::CaseSpec s;
    s.B = B, s.T = T, s.seqlens = std::move(lens), s.H = H, s.HV = HV, s.K = K, s.V = V;
    v.push_back(s);
  };
  add(1, 1, {}, 2, 2, 64, 64);
  add(2, 63, {}, 2, 2, 64, 64);
  add(1, 64, {}, 1, 2, 32, 64);
  add(2, 65, {}, 2, 4, 64, 32);
  add(1, 0, {50, 100, 1, 77}, 2, 2, 32, 32);
  add(1, 0, {64, 37, 0, 90, 1, 60}, 1, 3, 64, 64);
  add(1, 333, {}, 2, 2, 128, 128);
  add(1, 0, {129, 255}, 1, 2, 128, 96);
  return v;
}

std::vector<GpuCase> sweep(uint64_t seed) {
  std::vector<GpuCase> out;
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f16};
  int i = 0;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (const val::CaseSpec& base : layouts())
      for (FlagSet f : kFlagSets) {
        val::CaseSpec s = base;
        s.variant = var;
        if (!apply(f, s)) continue;
        // every layout meets every flag set once per variant; dtypes and o dtypes rotate over them
        if ((i++ % 4) != 0 && f != FlagSet::plain && base.K != 128) continue;
        GpuCase g;
        g.spec = s;
        g.spec.seed = seed + out.size();
        g.qkv = dtypes[out.size() % 3];
        g.o = (out.size() % 5 == 4) ? g.qkv : DType::f32;
        out.push_back(g);
      }
  return out;
}

}  // namespace

TEST_CASE("cuda-chunkwise forward matches the float64 oracle" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const GpuCase& gc : sweep(val::seed_from_env(600))) {
    SUBCASE(gc.name().c_str()) {
      const val::CaseData c = test::round_case(val::make_case(gc.spec), gc.qkv);
      const auto ref = val::run_case<double>(*oracle, c, false);
      const Problem p = c.problem(DType::f32);
      test::DeviceInputs din = test::upload_inputs(*gpu, c, gc.qkv);
      test::DeviceTensor o = test::poisoned(*gpu, gc.o, shape_v(p)), ht;
      if (gc.spec.final_state) ht = test::poisoned(*gpu, DType::f32, shape_state(p));
      gpu->forward(p, din.views, {o.view, ht.view});
      const bool split = gc.qkv == DType::f32;
      const double bar_o = split ? val::tol::kFloatVsDouble
                                 : (gc.o == DType::f32 ? val::tol::kCudaTf32 : val::tol::kFlaChunkOutput);
      test::check_rel_l2("o", gc.name(), test::to_host(*gpu, o.view), ref.out.o.view(), bar_o);
      if (gc.spec.final_state)
        test::check_rel_l2("final_state", gc.name(), test::to_host(*gpu, ht.view), ref.out.final_state.view(),
                           split ? val::tol::kFloatVsDouble : val::tol::kCudaTf32);
    }
  }
}

TEST_CASE("cuda-chunkwise rejects mismatched q/k/v dtypes" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  val::CaseSpec s;
  s.K = s.V = 32;
  const val::CaseData c = val::make_case(s);
  const Problem p = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(*gpu, c, DType::bf16);
  test::DeviceTensor k32 = test::to_device(*gpu, c.k, DType::f32), o = test::poisoned(*gpu, DType::f32, shape_v(p));
  Inputs in = din.views;
  in.k = k32.view;
  CHECK_THROWS_WITH_AS(gpu->forward(p, in, {o.view, {}}), doctest::Contains("q, k, v must share one dtype"), Error);
}

// `kcp bench --explain`'s second half: the backend names the state kernel its last forward ran (the
// dispatch in Pipeline::Impl::launch_state / forward_state), and a kept forward says so.
TEST_CASE("cuda-chunkwise explains the kernels its last forward picked" * doctest::skip(!test::gpu_present())) {
  struct Expect {
    Variant var;
    DType qkv;
    bool keep;
    const char* text;
  };
  // gdn: 2 heads of V = 64: 8 blocks of 16 columns, one wave on any device (fold_layout.h), unless
  // KCP_CUDA_STATE_GROUPS forces a layout (scripts/gpu_fold_layouts.sh runs this file under 2x2)
  const cuda::FoldLayout forced = cuda::parse_fold_layout(std::getenv("KCP_CUDA_STATE_GROUPS"));
  const std::string fold = forced.groups ? "state chunk_state_fold (" + cuda::fold_layout_text(forced) + ")"
                                         : "state chunk_state_fold (1 warpgroup x 16 columns)";
  const std::string kept = fold + ", kept";
  const Expect expects[] = {
      {Variant::gdn, DType::bf16, false, fold.c_str()},
      {Variant::gdn, DType::f32, false, "state chunk_state"},
      {Variant::kda, DType::bf16, false, "state chunk_state_kda (2 blocks)"},  // V / 64 x N x HV = 1 x 1 x 2
      {Variant::kda, DType::f32, false, "state chunk_state"},
      {Variant::gla, DType::bf16, false, "state chunk_state_gla"},  // 3 chunks: no halves
      {Variant::gdn, DType::bf16, true, kept.c_str()},
  };
  const uint64_t seed = val::seed_from_env(620);
  for (const Expect& e : expects) {
    CAPTURE(e.text);
    cuda::CudaBackendOptions bo;
    bo.keep_forward = e.keep;
    auto gpu = cuda::make_cuda_backend({}, bo);
    CHECK(gpu->explain_last_forward().empty());  // no forward yet
    val::CaseSpec s;
    s.variant = e.var, s.T = 150, s.H = s.HV = 2, s.K = s.V = 64, s.seed = seed;
    const val::CaseData c = test::round_case(val::make_case(s), e.qkv);
    const Problem p = c.problem(DType::f32);
    test::DeviceInputs din = test::upload_inputs(*gpu, c, e.qkv);
    test::DeviceTensor o = test::poisoned(*gpu, DType::f32, shape_v(p));
    gpu->forward(p, din.views, {o.view, {}});
    gpu->synchronize();
    CHECK(gpu->explain_last_forward() == e.text);
  }
}
