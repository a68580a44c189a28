// cuda-chunkwise backward (cuda/chunk_bwd.cuh) of gdn, kda and gla:
//  1. stages: after one backward, each float32 workspace buffer against its CPU chunkwise twin
//     (reference/chunkwise_backward.cpp, float64, on the same inputs): dh and dvnew (stage dhu; gla's
//     dvnew is its dv, which dhu writes),
//     dq/dk per value head, dbeta w.r.t. the effective beta (not gla) and da w.r.t. the log decay (stage chunk),
//     in pipeline order, so the first failing buffer names the kernel; once more with the pipeline
//     assuming one multiprocessor (Pipeline::set_multiprocessors), which runs dhu in 32-column blocks
//     and stages do in float32 (gla with 16-bit inputs: the scan over B_c; else its dh chain);
//     it asks for dv only, so intra writes the workspace (dqv, dkv, da), not the outputs;
//  2. the whole gradient against the float64 oracle (cpu-recurrent) over the forward tests' sweep:
//     lengths 1, 63, 64, 65, odd long, packed sequences, grouped value heads, every flag, q/k/v in
//     float32, float16, bfloat16; dq, dk, dv and d_o in the input dtype, the rest float32 (FLA's dtypes);
//     and kda / gla with gates that put anchored and exact-exponent 16-row blocks in one chunk, and gla
//     with gates of both signs in one chunk (an excursion the one anchor of gla's kkt and intra must
//     not take; intra's other slab of those chunks is anchored, so both its kernels run); the
//     layouts with H = HV and no L2 norm take intra's direct outputs (dq, dk, dg in their dtypes, no
//     finish copy: BwdParams::direct_qk / direct_dg), the others the workspace and finish;
//  3. transition_backward (dS_ext, M^T) of a range of sequences against the oracle's (both as the
//     columns of one chain launch), through the backend and with 32-column blocks (assumed 1 or 24 multiprocessors).
//  4. d_o one element off a 16-byte boundary (gla's dh chain needs aligned rows: the scan instead).
//  5. transition_backward's dS_ext with do in 16 bits (the chain's unsplit products), gdn and kda.
// Every output is NaN-poisoned first: a NaN left is an unwritten element.
// Bars (validation/tolerance.h, float_rule.h): 16-bit inputs: FLA's own bars for its chunk kernels
// (kFlaChunkGrad for dq, dk, dv, dh0; kFlaChunkGateBeta for dg, dbeta, dA_log, ddt_bias), since the
// forward's intermediates are TF32-rounded as FLA's are rounded to 16 bits; float32 inputs: the
// forward's float32 bar kFloatVsDouble, or the float32 rule against the float32 recurrence where that
// is looser (the gate gradients, whose floor scales with the sum's condition number). The float32
// rule alone is not met by the chunkwise pipeline on strong (softplus) gates: the gate cumsum is
// float32 (as the forward's and FLA's), so exp2 of its differences carries ~eps |B| relative error;
// observed 2e-6 .. 5e-6 on dq, dk, dv, dbeta (H100, 2026-11-24), FLA's own float32 error is ~1e-3.
// Stages and transitions: kCudaTf32 (16-bit) / kFloatVsDouble.
// Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/transition.h"
#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "reference/backend_cpu.h"
#include "reference/chunkwise.h"
#include "tests/cuda/cuda_support.h"
#include "tests/cuda/stage_twin.h"
#include "validation/compare.h"
#include "validation/float_rule.h"
#include "validation/run_case.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

using BwdCase = test::DtypeCase;

std::vector<BwdCase> sweep(uint64_t seed) {
  struct L { int64_t B, T; std::vector<int64_t> lens; int64_t H, HV, K, V; };
  const std::vector<L> layouts = {{1, 1, {}, 2, 2, 64, 64},          {2, 63, {}, 2, 2, 64, 64},
                                  {1, 64, {}, 1, 2, 32, 64},         {2, 65, {}, 2, 4, 64, 32},
                                  {1, 0, {50, 100, 1, 77}, 2, 2, 32, 32}, {1, 0, {64, 37, 0, 90, 1, 60}, 1, 3, 64, 64},
                                  {1, 333, {}, 2, 2, 128, 128},      {1, 0, {129, 255}, 1, 2, 128, 96}};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f16};
  std::vector<BwdCase> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (size_t li = 0; li < layouts.size(); ++li)
      for (int f = 0; f < 10; ++f) {
        if ((li + size_t(f)) % 3 != 0 && f != 0) continue;  // every flag on some layouts, plain on all
        const L& l = layouts[li];
        val::CaseSpec s;
        s.variant = var, s.B = l.B, s.T = l.T, s.seqlens = l.lens, s.H = l.H, s.HV = l.HV, s.K = l.K, s.V = l.V;
        Flags& fl = s.flags;
        switch (f) {
          case 1: fl.use_qk_l2norm_in_kernel = true; break;
          case 2:
          case 3:
            if (var == Variant::gla) continue;  // gla has no beta
            fl.use_beta_sigmoid_in_kernel = true, fl.allow_neg_eigval = f == 3;
            break;
          case 4: fl.use_gate_in_kernel = true; break;
          case 5: fl.use_gate_in_kernel = true, s.dt_bias = false; break;
          case 6:
          case 7:
            if (var == Variant::gdn) continue;  // per-channel gates only (kda, gla)
            fl.use_gate_in_kernel = true, fl.lower_bound = -5.0, fl.safe_gate = true, s.A_log = f == 6;
            break;
          case 8: fl.state_v_first = true; break;
          case 9: s.initial_state = s.final_state = false, s.scale = 0.3; break;
          default: break;
        }
        BwdCase c;
        c.spec = s, c.spec.seed = seed + out.size(), c.qkv = dtypes[out.size() % 3];
        out.push_back(c);
      }
  // gdn's fused norm backward inside kernel intra (one value head per q/k head: BwdParams::direct_qk):
  // K = 64 and 32 in one pass over the keys, K = 128 in two (the first pass's sums kept in shared
  // memory), packed sequences, each input dtype; the layouts above with the norm all group heads.
  for (const size_t li : {size_t(0), size_t(1), size_t(4), size_t(6), size_t(7)}) {
    const L& l = layouts[li];
    BwdCase c;
    val::CaseSpec& s = c.spec;
    s.variant = Variant::gdn, s.B = l.B, s.T = l.T, s.seqlens = l.lens, s.H = l.H, s.HV = l.H, s.K = l.K, s.V = l.V;
    s.flags.use_qk_l2norm_in_kernel = true, s.seed = seed + out.size(), c.qkv = dtypes[out.size() % 3];
    out.push_back(c);
  }
  return out;
}

template <class S>
const Tensor<S>& host_grad(const val::GradSet<S>& g, const std::string& n) {
  if (n == "dq") return g.dq;
  if (n == "dk") return g.dk;
  if (n == "dv") return g.dv;
  if (n == "dg") return g.dg;
  if (n == "dbeta") return g.dbeta;
  if (n == "dinitial_state") return g.dh0;
  if (n == "dA_log") return g.dA_log;
  return g.ddt_bias;
}

// The whole gradient of one case (its gates already in c) against the float64 oracle, at the bars
// described at the top of this file. do_offset: d_o one element past a 16-byte boundary (gla's dh
// chain copies do rows 16 bytes at a time; such a view must take the scan, not fault).
void check_gradient(Backend& gpu, Backend& oracle, const BwdCase& bc, val::CaseData& c, bool do_offset = false) {
  for (int64_t i = 0; i < c.d_o.numel(); ++i) c.d_o.data()[i] = round_to(bc.qkv, c.d_o.data()[i]);  // FLA: do in the input dtype
  const auto ref = val::run_case<double>(oracle, c, true);
  const Problem p = c.problem(DType::f32);
  test::DeviceInputs din = test::upload_inputs(gpu, c, bc.qkv);
  Tensor<double> do_host({c.d_o.numel() + (do_offset ? 1 : 0)});
  std::copy(c.d_o.data(), c.d_o.data() + c.d_o.numel(), do_host.data() + (do_offset ? 1 : 0));
  test::DeviceTensor d_o = test::to_device(gpu, do_host, bc.qkv), dht;
  const TensorView do_view(static_cast<char*>(d_o.view.data) + (do_offset ? dtype_size(bc.qkv) : 0), bc.qkv, c.d_o.shape(),
                           Device::cuda);
  if (!c.dht.empty()) dht = test::to_device(gpu, c.dht, DType::f32);
  test::DeviceGrads dg = test::device_grads(gpu, ref.grads, bc.qkv);
  gpu.backward(p, din.views, {do_view, dht.view}, dg.views);
  val::RunResult<float> r32;
  val::GradConditioning cond;
  const bool f32 = bc.qkv == DType::f32;
  if (f32) {  // the float32 rule's baseline: the float32 recurrence on the same inputs
    r32 = val::run_case<float>(oracle, c, true);
    cond = val::grad_conditioning(c.problem(DType::f64), c.inputs(), c.cotangents(), ref.grads.dg.view());
  }
  for (const test::DeviceGrad& d : dg.t) {
    const std::string& name = d.name;
    const Tensor<double>& want = *d.want;
    double bar = test::fla_chunk_bar(name);
    if (f32)  // the forward's float32 bar, or the float32 rule where that is looser (the gate sums)
      bar = std::max(val::tol::kFloatVsDouble,
                     val::float_rule_bar(val::compare(host_grad(r32.grads, name).view(), want.view()).rel_l2, cond.of(name)));
    test::check_rel_l2(name, bc.name(), test::to_host(gpu, d.t.view), want.view(), bar);
  }
}

// Two packed sequences (150 and 70 tokens: three chunks with a partial one, and one), H = 1, HV = 2,
// K = 64, V = 32: the small case of the targeted tests below.
BwdCase two_sequence_case(Variant var, DType dt, uint64_t seed) {
  BwdCase bc;
  bc.spec.variant = var, bc.spec.seqlens = {150, 70}, bc.spec.H = 1, bc.spec.HV = 2, bc.spec.K = 64, bc.spec.V = 32;
  bc.spec.seed = seed, bc.qkv = dt;
  return bc;
}

}  // namespace

TEST_CASE("cuda-chunkwise backward matches the float64 oracle" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  for (const BwdCase& bc : sweep(val::seed_from_env(800))) {
    SUBCASE(bc.name().c_str()) {
      val::CaseData c = test::round_case(val::make_case(bc.spec), bc.qkv);
      check_gradient(*gpu, *oracle, bc, c);
    }
  }
}

TEST_CASE("cuda-chunkwise backward with d_o off 16-byte alignment" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(804);
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (DType dt : {DType::bf16, DType::f32}) {
      const BwdCase bc = two_sequence_case(var, dt, seed);
      SUBCASE((bc.name() + " d_o=offset").c_str()) {
        val::CaseData c = test::round_case(val::make_case(bc.spec), dt);
        check_gradient(*gpu, *oracle, bc, c, true);
      }
    }
}

// kda and gla's 16-row blocks take anchored products (kkt's diagonal blocks, wy's build_diag, intra's
// in-block pairs) where the block's gate spread is <= 64 in log2 units, else exact exponents; the
// sweep's gates keep every block on one side per case. Here one chunk holds both: key 0 decays by
// -4 per token (natural log) in rows 16..31 of every chunk (spread 15 * 4 / ln 2 = 87 in log2 units)
// and by at most 0.3 elsewhere (spread <= 6.5), so in each chunk block 1's slab with key 0 runs the
// exact pairs and every other block and slab the anchored ones, in the forward's kkt and in the
// backward. The chunk's spread (> 64) also keeps gla's kkt off its one-anchor-per-chunk path
// (chunk_kkt_gla.cuh), which the sweep's mild gates take. The case checks the premise on the host.
TEST_CASE("cuda-chunkwise backward with anchored and exact blocks in one chunk" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(803);
  for (Variant var : {Variant::kda, Variant::gla})
    for (DType dt : {DType::bf16, DType::f32}) {
      const BwdCase bc = two_sequence_case(var, dt, seed);
      SUBCASE((bc.name() + " gates=straddle").c_str()) {
        val::CaseData c = test::round_case(val::make_case(bc.spec), dt);
        const Problem p = c.problem();
        double strong = 1e300, mild = 0;  // the smallest spread of a strong block, the largest elsewhere
        for (int64_t n = 0; n < p.N; ++n) {
          const SeqRange seq = p.sequence(n);
          for (int64_t hv = 0; hv < p.HV; ++hv) {
            for (int64_t r = 0; r < seq.len; ++r)
              if (r % 64 >= 16 && r % 64 < 32) c.g(0, seq.t0 + r, hv, 0) = -4.0;
            for (int64_t b0 = 0; b0 + 16 <= seq.len; b0 += 16)  // whole blocks
              for (int64_t k = 0; k < p.K; ++k) {
                double sp = 0;
                for (int64_t r = b0 + 1; r < b0 + 16; ++r) sp -= c.g(0, seq.t0 + r, hv, k) / std::log(2.0);
                if (k == 0 && b0 % 64 == 16) strong = std::min(strong, sp);
                else mild = std::max(mild, sp);
              }
          }
        }
        REQUIRE(strong > 80.0);  // well on each side of the kernels' 64
        REQUIRE(mild < 10.0);
        check_gradient(*gpu, *oracle, bc, c);
      }
    }
}

// gla's kkt and backward intra anchor a chunk at its last row only where every row's gate cumsum lies
// within 64 (log2) of the last one's (chunk_kkt_gla.cuh, chunk_bwd_intra_gla.cu: per 32-key slab; K =
// 64 here, so keys 32..63 of the same chunks take intra's anchored kernel). Gates of both signs: key 0 grows by 0.7 per token (natural
// log) in rows 0..9 of every chunk and decays by 0.8985 in rows 10..63, so b_9 - b_63 = 70 while
// b_0 - b_63 = 61: a check of the first row alone would anchor these chunks, and qa, kg would carry
// 2^70 and 2^-70 (finite here; past 2^126 they overflow or flush). The growth inside a chunk stays
// at 2^9, so the gradients are ordinary. The premise is checked on the host.
TEST_CASE("cuda-chunkwise gla with gates of both signs in one chunk" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(805);
  for (DType dt : {DType::bf16, DType::f32}) {
    const BwdCase bc = two_sequence_case(Variant::gla, dt, seed);
    SUBCASE((bc.name() + " gates=excursion").c_str()) {
      val::CaseData c = test::round_case(val::make_case(bc.spec), dt);
      const Problem p = c.problem();
      const double ln2 = std::log(2.0);
      for (int64_t n = 0; n < p.N; ++n) {
        const SeqRange seq = p.sequence(n);
        for (int64_t hv = 0; hv < p.HV; ++hv) {
          for (int64_t r = 0; r < seq.len; ++r) c.g(0, seq.t0 + r, hv, 0) = r % 64 < 10 ? 0.7 : -0.8985;
          for (int64_t c0 = 0; c0 + 64 <= seq.len; c0 += 64) {  // whole chunks: the premise
            std::vector<double> b(64);
            double acc = 0;
            for (int64_t r = 0; r < 64; ++r) b[r] = (acc += c.g(0, seq.t0 + c0 + r, hv, 0) / ln2);
            double far = 0, grow = 0;
            for (int64_t r = 0; r < 64; ++r) {
              far = std::max(far, std::abs(b[r] - b[63]));
              for (int64_t s2 = 0; s2 <= r; ++s2) grow = std::max(grow, b[r] - b[s2]);
            }
            REQUIRE(std::abs(b[0] - b[63]) < 64.0);
            REQUIRE(far > 68.0);
            REQUIRE(grow < 10.0);
          }
        }
      }
      check_gradient(*gpu, *oracle, bc, c);
    }
  }
}

TEST_CASE("cuda-chunkwise backward stages match the CPU chunkwise twin" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const uint64_t seed = val::seed_from_env(801);
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (DType dt : {DType::f32, DType::bf16}) {
      val::CaseSpec s;
      s.variant = var, s.seqlens = {70, 0, 130, 1}, s.H = 1, s.HV = 2, s.K = 64, s.V = 32, s.seed = seed;
      s.flags.use_qk_l2norm_in_kernel = true;
      for (const int sms : {0, 1})  // 1: the chains in 32-column blocks (Pipeline::set_multiprocessors)
      // do in the input dtype (gla: dh by its chain, chunk_state_gla.cu), or float32 with 16-bit
      // inputs and sms = 1 (gla: mixed dtypes take the scan over B_c, chunk_bwd_dh_gla.cu)
      SUBCASE((s.name() + " qkv=" + std::string(dtype_name(dt)) + (sms ? " sms=1 do=f32" : "")).c_str()) {
        val::CaseData c = test::round_case(val::make_case(s), dt);
        const DType do_dt = sms ? DType::f32 : dt;
        for (int64_t i = 0; i < c.d_o.numel(); ++i) c.d_o.data()[i] = round_to(do_dt, c.d_o.data()[i]);
        const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
        test::DeviceInputs din = test::upload_inputs(*gpu, c, dt);
        test::DeviceTensor d_o = test::to_device(*gpu, c.d_o, do_dt), dht = test::to_device(*gpu, c.dht, DType::f32);
        cuda::Pipeline pipe(gpu->queue());
        pipe.set_multiprocessors(sms);
        // gla: dv = dvnew = A_c + kg dh[c], written in dv's dtype by dhu (chunk_bwd_dh_gla.cu; no A_c in dvnew)
        const bool gla = var == Variant::gla;
        test::DeviceTensor dv_gla = gla ? test::poisoned(*gpu, DType::f32, shape_v(p32)) : test::DeviceTensor{};
        Grads gr;
        gr.dv = dv_gla.view;
        pipe.backward(p32, din.views, {d_o.view, dht.view}, gr);
        const cuda::BackwardBuffers& b = pipe.backward_buffers();
        test::BackwardTwin t = test::make_backward_twin(p64, c.inputs(), c.cotangents());
        const double bar = dt == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
        const std::string nm = s.name();
        // pipeline order: the first failure names the kernel
        if (!test::check_rel_l2("dhu:dh", nm, test::to_host(*gpu, b.dh), t.dh.view(), bar)) return;
        const TensorView dvnew_ref = gla ? TensorView(t.dvnew.data(), DType::f64, shape_v(p64)) : t.dvnew.view();
        if (!test::check_rel_l2("dhu:dvnew", nm, test::to_host(*gpu, gla ? dv_gla.view : b.dvnew), dvnew_ref, bar)) return;
        test::check_rel_l2("chunk:dq", nm, test::to_host(*gpu, b.dqv), t.dqv.view(), bar);
        test::check_rel_l2("chunk:dk", nm, test::to_host(*gpu, b.dkv), t.dkv.view(), bar);
        if (p64.delta_rule()) test::check_rel_l2("chunk:dbeta", nm, test::to_host(*gpu, b.dbeta_e), t.dbeta.view(), bar);
        test::check_rel_l2("chunk:da", nm, test::to_host(*gpu, b.da), t.da.view(), bar);
      }
    }
}

namespace {

// dS_ext alone ([count,HV,K,V]: the chain from 0 over V columns, no M^T columns) of the sequences
// [first, first + count), written by `call` into a NaN-poisoned buffer, against the oracle's (`ref`: its
// whole transitions of every sequence) under `bar`.
template <class Call>
void check_ds_ext_alone(Backend& gpu, const Problem& p32, int64_t first, int64_t count, const Tensor<double>& ref,
                        const std::string& name, double bar, Call&& call) {
  const test::DeviceTensor ds = test::poisoned(gpu, DType::f32, transition_s_shape(count, p32.HV, p32.K, p32.V));
  call(ds.view);
  const Tensor<double> got = test::to_host(gpu, ds.view);
  for (int64_t i = 0; i < count; ++i)
    test::check_rel_l2("ds_ext alone", name, to_tensor<double>(transition_element(got.view(), i)),
                       transition_s(transition_element(ref.view(), first + i)), bar);
}

}  // namespace

TEST_CASE("transition_backward of a range of sequences matches the oracle's (dS_ext, M^T)" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(802);
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})  // gla: M^T is diagonal
    for (DType dt : {DType::f32, DType::bf16}) {
      const val::CaseSpec s = test::transition_case_spec(var, dt, seed);
      SUBCASE((s.name() + " qkv=" + std::string(dtype_name(dt))).c_str()) {
        const val::CaseData c = test::round_case(val::make_case(s), dt);
        const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
        test::DeviceInputs din = test::upload_inputs(*gpu, c, dt);
        test::DeviceTensor d_o = test::to_device(*gpu, c.d_o, DType::f32);
        const double bar = dt == DType::f32 ? val::tol::kFloatVsDouble : val::tol::kCudaTf32;
        Tensor<double> ref(transition_shape(p64.N, p64.HV, p64.K, p64.V));
        oracle->transition_backward(p64, c.inputs(), c.d_o.view(), 0, ref.view());
        // The backend as users call it (sms 0), and pipelines assuming 1 or 24 multiprocessors, whose dhu
        // takes 32-column blocks (1: every range; 24: the 4-sequence range): both grid shapes of the
        // joint chain on these small cases.
        for (const int sms : {0, 1, 24})
        for (const auto [first, count] : test::kTransitionRanges) {
          INFO("sequences [", first, ", ", first + count, "), assumed multiprocessors ", sms);
          test::DeviceTensor packed = test::poisoned(*gpu, DType::f32, transition_shape(count, p32.HV, p32.K, p32.V));
          cuda::Pipeline pipe(gpu->queue());
          pipe.set_multiprocessors(sms);
          if (sms > 0) pipe.transition_backward(p32, din.views, d_o.view, first, packed.view);
          else gpu->transition_backward(p32, din.views, d_o.view, first, packed.view);
          const Tensor<double> got = test::to_host(*gpu, packed.view);
          for (int64_t i = 0; i < count; ++i) {
            const TensorView g = transition_element(got.view(), i), r = transition_element(ref.view(), first + i);
            test::check_rel_l2("ds_ext", s.name(), to_tensor<double>(transition_s(g)), transition_s(r), bar);
            test::check_rel_l2("m_t", s.name(), to_tensor<double>(transition_m(g)), transition_m(r), bar);
          }
          // dS_ext alone ([count,HV,K,V]: the chain from 0 over V columns, no M^T columns), as CP asks
          // where it has M^T from the forward
          check_ds_ext_alone(*gpu, p32, first, count, ref, s.name(), bar, [&](const TensorView& ds) {
            if (sms > 0) pipe.transition_backward(p32, din.views, d_o.view, first, ds);
            else gpu->transition_backward(p32, din.views, d_o.view, first, ds);
          });
        }
      }
    }
}

// transition_backward's dS_ext alone with do in 16 bits (CP's backward transition where it has M^T from
// the forward, as `kcp cp-bench` and the CP layer call it with bf16 gradients): the dh chain's unsplit
// products (one TF32 product per step), which the transition test above (float32 do: split products)
// does not reach, against the oracle under the bar of 16-bit inputs. Cases: K = 64 and 128, V = 64 and
// 128, packed with an empty, a one-token and short last chunks.
TEST_CASE("transition_backward's dS_ext with 16-bit do matches the oracle's" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const uint64_t seed = val::seed_from_env(805);
  struct TrShape { int64_t K, V, H, HV; DType qkv; };
  for (const TrShape& sh : {TrShape{64, 64, 1, 2, DType::bf16}, TrShape{128, 128, 2, 2, DType::f16}, TrShape{128, 64, 1, 2, DType::bf16}})
    for (Variant var : {Variant::gdn, Variant::kda}) {
      val::CaseSpec s = test::transition_case_spec(var, sh.qkv, seed + uint64_t(sh.K + sh.V));
      s.K = sh.K, s.V = sh.V, s.H = sh.H, s.HV = sh.HV;
      SUBCASE((s.name() + " qkv=" + std::string(dtype_name(sh.qkv))).c_str()) {
        val::CaseData c = test::round_case(val::make_case(s), sh.qkv);
        for (double& x : c.d_o.vec()) x = round_to(sh.qkv, x);
        const Problem p64 = c.problem(DType::f64), p32 = c.problem(DType::f32);
        const test::DeviceInputs din = test::upload_inputs(*gpu, c, sh.qkv);
        const test::DeviceTensor d_o = test::to_device(*gpu, c.d_o, sh.qkv);
        Tensor<double> ref(transition_shape(p64.N, p64.HV, p64.K, p64.V));
        oracle->transition_backward(p64, c.inputs(), c.d_o.view(), 0, ref.view());
        for (const auto [first, count] : test::kTransitionRanges) {
          INFO("sequences [", first, ", ", first + count, ")");
          check_ds_ext_alone(*gpu, p32, first, count, ref, s.name(), val::tol::kCudaTf32, [&](const TensorView& ds) {
            gpu->transition_backward(p32, din.views, d_o.view, first, ds);
          });
        }
      }
    }
}
