// The kept forward (cuda::Pipeline::set_keep_forward, cuda/chunkwise_keep.cu): a forward that keeps
// its intermediates gives the plain forward's o and final state, and the backward after it (which
// skips the recompute: kept_reuses() counts it) gives the recomputing backward's gradients, bit for
// bit (the same kernels on the same inputs), over gdn, kda, gla x bf16, float32 x packed and dense
// layouts x h0, final state, state_v_first, the fused gate and L2 norm, and gla's cases again with
// its chain in halves forced (set_gla_halves(1): the kept forward's h corrected by the output, the
// recompute's by its own kernel, bit for bit). And the record is used at most
// once and never for other inputs: a second backward, a call in between, q, k, v or g changed in place
// (the fingerprint, compared after the backward's kernels read the record: that backward runs again
// with the recompute), another problem: each recomputes and still equals the plain pipeline. And the CP
// layer's order (forward, transition_backward of all sequences, backward) reuses it twice. And the
// fingerprint itself: its two paths (contiguous words, gathered words) agree on a strided view and its
// contiguous copy, one changed element or another salt changes it, and one call over several views
// (one launch for the contiguous ones) gives the sum of their single-view values. And the front stages a
// transition_forward or forward_prepare leaves to the kept forward. And kda's kept forward on the
// transposed chain (where its blocks fill the device: one multiprocessor assumed), also in windows of
// chunks (the unwindowed results bit for bit); gdn's in the layouts one multiprocessor gives (the folded
// chain 2 x 2 where V is a multiple of 64, dhu at 32 columns).
// Outputs and gradients NaN-poisoned first. Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/transition.h"
#include "cuda/backend_cuda.h"
#include "cuda/chunkwise.h"
#include "cuda/input_fingerprint.cuh"
#include "tests/cuda/cuda_support.h"
#include "tests/cuda/pipeline_runs.h"
#include "validation/compare.h"

using namespace kcp;

namespace {

using KeepCase = test::DtypeCase;
using test::check_grads_same;
using test::check_same;
using test::Results;
using test::run_backward;
using test::run_forward;
using test::stage;
using test::Staged;

std::vector<KeepCase> cases(uint64_t seed) {
  std::vector<KeepCase> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (DType qkv : {DType::bf16, DType::f32})
      for (int layout = 0; layout < 3; ++layout) {
        KeepCase k;
        val::CaseSpec& s = k.spec;
        s.variant = var;
        if (layout == 0) s.seqlens = {64, 1, 65, 300, 0, 129}, s.H = 1, s.HV = 2, s.K = 64, s.V = 32;
        if (layout == 1) s.B = 2, s.T = 333, s.H = 2, s.HV = 2, s.K = 128, s.V = 128, s.flags.state_v_first = true;
        if (layout == 2) s.T = 700, s.H = 1, s.HV = 2, s.K = 128, s.V = 64, s.initial_state = false;
        if (layout == 2) s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
        s.seed = seed + out.size();
        k.qkv = qkv;
        out.push_back(k);
      }
  return out;
}

}  // namespace

TEST_CASE("kept forward: the plain forward's outputs and the recomputing backward's gradients, bit for bit" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  for (const KeepCase& kc : cases(val::seed_from_env(1400)))
   for (int mode : {0, 1, 2}) {  // 1: gla's chain in halves wherever it applies (one sequence, 16-bit);
                                 // 2: kda or gdn assuming one multiprocessor (kda's kept chain then the
                                 // transposed one; gdn's folded chain 2 x 2 where V allows, dhu at 32 columns)
    if ((mode == 1 && kc.spec.variant != Variant::gla) || (mode == 2 && kc.spec.variant == Variant::gla)) continue;
    const char* const suffix = mode == 1 ? " halves" : mode == 2 ? " one multiprocessor" : "";
    SUBCASE((kc.name() + suffix).c_str()) {
      const Staged s = stage(*gpu, kc);
      cuda::Pipeline plain(gpu->queue()), kept(gpu->queue());
      kept.set_keep_forward(true);
      const int halves = mode == 1 ? 1 : -1, sms = mode == 2 ? 1 : 0;
      plain.set_gla_halves(halves), kept.set_gla_halves(halves);
      plain.set_multiprocessors(sms), kept.set_multiprocessors(sms);
      Results a = run_forward(*gpu, plain, s), b = run_forward(*gpu, kept, s);
      check_same("o", b.o, a.o, kc.name());
      if (kc.spec.final_state) check_same("final_state", b.ht, a.ht, kc.name());
      run_backward(*gpu, plain, s, s.din.views, kc.qkv, a);
      run_backward(*gpu, kept, s, s.din.views, kc.qkv, b);
      CHECK(kept.kept_reuses() == 1);  // the backward used the kept forward
      CHECK(kept.kept_redos() == 0);   // and its inputs fingerprinted as the forward's
      CHECK(plain.kept_reuses() == 0);
      check_grads_same(b, a, kc.name());
      // kda with 16-bit inputs and V a multiple of 64, its chain's blocks filling the one multiprocessor
      // assumed: the kept forward (and so the recompute it must equal) ran the transposed chain
      const bool transposed = mode == 2 && kc.spec.variant == Variant::kda && kc.qkv != DType::f32 && kc.spec.V % 64 == 0;
      CHECK_MESSAGE(kept.kda_chain_used() == transposed, kc.name(), suffix);
      std::printf("  kept forward: %zu gradients equal  %s%s\n", b.grads.size(), kc.name().c_str(), suffix);
    }
   }
}

// kda's kept forward in windows of 3 chunks (Pipeline::set_kda_window: window w's kkt and WY beside
// the chain of window w - 1, h and vnew stored by each window's chain; one multiprocessor assumed, so
// that the kept forward takes the transposed chain) gives the unwindowed kept forward's o and final
// state, and the backward after it the recomputing backward's gradients, bit for bit; it ran in the
// windows expected (none where the transposed chain does not run).
TEST_CASE("kept forward in windows: the unwindowed outputs and the recomputing backward's gradients, bit for bit" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  constexpr int kWindow = 3;
  const std::vector<KeepCase> all = cases(val::seed_from_env(1405));
  for (const KeepCase& kc : {all[6], all[6 + 1], all[6 + 2]}) {  // kda bf16: packed V = 32 (no chain), dense, fused gate
    SUBCASE(kc.name().c_str()) {
      const Staged s = stage(*gpu, kc);
      cuda::Pipeline plain(gpu->queue()), kept(gpu->queue());
      kept.set_keep_forward(true);
      plain.set_kda_window(0), kept.set_kda_window(kWindow);
      plain.set_multiprocessors(1), kept.set_multiprocessors(1);
      Results a = run_forward(*gpu, plain, s), b = run_forward(*gpu, kept, s);
      const bool transposed = kc.spec.V % 64 == 0;
      CHECK(kept.kda_chain_used() == transposed);
      const int64_t chunks = test::cuda_chunk_count(s.p);
      CHECK_MESSAGE(kept.kda_windows_used() == (transposed ? (chunks + kWindow - 1) / kWindow : 0), kc.name());
      check_same("o", b.o, a.o, kc.name() + " (windows)");
      if (kc.spec.final_state) check_same("final_state", b.ht, a.ht, kc.name() + " (windows)");
      run_backward(*gpu, plain, s, s.din.views, kc.qkv, a);
      run_backward(*gpu, kept, s, s.din.views, kc.qkv, b);
      CHECK(kept.kept_reuses() == 1);
      check_grads_same(b, a, kc.name() + " (windows)");
    }
  }
}

TEST_CASE("kept forward: used once, never after another call, for changed inputs or another problem" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const std::vector<KeepCase> all = cases(val::seed_from_env(1401));
  for (const KeepCase& kc : {all[0], all[6 + 3 + 1]}) {  // gdn bf16 packed (the folded kernel), kda float32 dense
    SUBCASE(kc.name().c_str()) {
      const Staged s = stage(*gpu, kc);
      cuda::Pipeline plain(gpu->queue()), kept(gpu->queue());
      kept.set_keep_forward(true);
      Results want;
      run_backward(*gpu, plain, s, s.din.views, kc.qkv, want);
      auto kept_backward = [&](const Inputs& in) {
        Results r;
        run_backward(*gpu, kept, s, in, kc.qkv, r);
        return r;
      };
      run_forward(*gpu, kept, s);
      check_grads_same(kept_backward(s.din.views), want, kc.name());
      CHECK(kept.kept_reuses() == 1);
      // a second backward: the record is gone (the backward's buffers overwrote the kept ones)
      check_grads_same(kept_backward(s.din.views), want, kc.name() + " (second backward)");
      CHECK(kept.kept_reuses() == 1);
      // a call in between
      run_forward(*gpu, kept, s);
      kept.prepare_stages(s.p, s.din.views);
      check_grads_same(kept_backward(s.din.views), want, kc.name() + " (call in between)");
      CHECK(kept.kept_reuses() == 1);
      // another problem (the scale) on the same inputs
      run_forward(*gpu, kept, s);
      {
        Staged t = stage(*gpu, kc);
        t.p.scale *= 0.5;
        Results r2, w2;
        run_backward(*gpu, kept, t, t.din.views, kc.qkv, r2);
        run_backward(*gpu, plain, t, t.din.views, kc.qkv, w2);
        check_grads_same(r2, w2, kc.name() + " (another scale)");
      }
      CHECK(kept.kept_reuses() == 1);
      // q, k, v or g changed in place after the kept forward: same views, other contents (each input
      // enters the fingerprint with its own salt, so a change to any one of them must show)
      KeepCase other = kc;
      other.spec.seed += 1000;
      const val::CaseData c2 = test::round_case(val::make_case(other.spec), kc.qkv);
      struct Change {
        const char* what;
        const TensorView* view;
        const Tensor<double>* contents;
      };
      const Change changes[] = {{"q", &s.din.views.q, &c2.q}, {"k", &s.din.views.k, &c2.k},
                                {"v", &s.din.views.v, &c2.v}, {"g", &s.din.views.g, &c2.g}};
      int64_t reuses = 1, redos = 0;
      for (const auto& [what, view, contents] : changes) {
        run_forward(*gpu, kept, s);
        test::upload_into(*gpu, *view, *contents);
        const Results changed = kept_backward(s.din.views);
        CHECK_MESSAGE(kept.kept_reuses() == reuses, what);
        CHECK_MESSAGE(kept.kept_redos() == ++redos, what);  // read the record, then ran again with the recompute
        Results want2;
        run_backward(*gpu, plain, s, s.din.views, kc.qkv, want2);
        check_grads_same(changed, want2, kc.name() + " (" + what + " changed in place)");
        // and the kept path is taken again for a fresh forward on the current inputs
        run_forward(*gpu, kept, s);
        check_grads_same(kept_backward(s.din.views), want2, kc.name() + " (kept again after " + what + ")");
        CHECK_MESSAGE(kept.kept_reuses() == ++reuses, what);
        CHECK_MESSAGE(kept.kept_redos() == redos, what);
      }
    }
  }
}

// The CP layer's order on a rank: forward, then transition_backward of all its sequences (or, on the
// first rank, backward_prepare), then the local backward. With the forward kept, the transition reads
// the kept front stages and leaves the record (kept_reuses counts every call that used it), and the
// backward skips its recompute and, its do being the transition's or the prepare's, dhu_local
// (kept_term_reuses); every result equals the plain pipeline's bit for bit (the transition's
// (dS_ext, M^T) included). With another do in the backward (0.5 do: a changed cotangent), it still
// skips the recompute but runs dhu_local, and equals the plain pipeline's. With set_inputs_unchanged
// on around the backward (the CP layer's local pass) the same reuses happen without fingerprints.
TEST_CASE("kept forward: a transition_backward of all sequences or a backward_prepare between forward and backward" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const std::vector<KeepCase> all = cases(val::seed_from_env(1402));
  struct Mode {
    const char* name;
    bool prepare, transition, same_do;
    int64_t reuses, term_reuses;
    bool vouched = false;  // set_inputs_unchanged on around the backward (the CP layer's local pass)
  };
  const Mode modes[] = {{"transition", false, true, true, 2, 1},
                        {"transition, another do in the backward", false, true, false, 2, 0},
                        {"prepare, transition", true, true, true, 3, 2},
                        {"prepare (first rank)", true, false, true, 2, 1},
                        {"prepare, another do in the backward", true, false, false, 2, 0},
                        {"transition, inputs vouched for", false, true, true, 2, 1, true},
                        {"prepare (first rank), inputs vouched for", true, false, true, 2, 1, true}};
  for (const KeepCase& kc : {all[2], all[1], all[6 + 2], all[12 + 3 + 2]})  // gdn bf16 one sequence / dense, kda bf16, gla f32
    for (const Mode& m : modes) {
      const std::string name = kc.name() + " (" + m.name + ")";
      SUBCASE(name.c_str()) {
        const Staged s = stage(*gpu, kc);
        cuda::Pipeline plain(gpu->queue()), kept(gpu->queue());
        kept.set_keep_forward(true);
        Results a = run_forward(*gpu, plain, s), b = run_forward(*gpu, kept, s);
        if (m.prepare) plain.backward_prepare(s.p, s.din.views, s.d_o.view), kept.backward_prepare(s.p, s.din.views, s.d_o.view);
        if (m.transition) {
          const Shape tshape = transition_shape(s.p.N, s.p.HV, s.p.K, s.p.V);
          const test::DeviceTensor ta = test::poisoned(*gpu, DType::f32, tshape), tb = test::poisoned(*gpu, DType::f32, tshape);
          plain.transition_backward(s.p, s.din.views, s.d_o.view, 0, ta.view);
          kept.transition_backward(s.p, s.din.views, s.d_o.view, 0, tb.view);
          check_same("transition_backward", test::to_host(*gpu, tb.view), test::to_host(*gpu, ta.view), name);
        }
        Tensor<double> half = s.c.d_o;
        for (double& x : half.vec()) x *= 0.5;  // exact in every dtype
        const test::DeviceTensor d_o2 = test::to_device(*gpu, half, kc.qkv);
        const TensorView* d_o = m.same_do ? nullptr : &d_o2.view;
        run_backward(*gpu, plain, s, s.din.views, kc.qkv, a, d_o);
        kept.set_inputs_unchanged(m.vouched);  // no fingerprint, no read-back: the same reuses, the same bits
        run_backward(*gpu, kept, s, s.din.views, kc.qkv, b, d_o);
        kept.set_inputs_unchanged(false);
        CHECK(kept.kept_reuses() == m.reuses);  // every call after the forward read its record
        CHECK(kept.kept_term_reuses() == m.term_reuses);
        CHECK(plain.kept_reuses() == 0);
        CHECK(plain.kept_term_reuses() == 0);
        check_grads_same(b, a, name);
      }
    }
}

// The CP layer's forward order on a rank: transition_forward of all its sequences (its initial state
// not yet known: none passed), or on the last rank forward_prepare, then the local forward with its
// initial state. With keep_forward the kept forward reads the front stages they left
// (kept_front_reuses) and still records the fingerprint of all its inputs (the front inputs' sum plus
// the initial state's), so the backward after it reuses the record; every result equals the plain
// pipeline's bit for bit. Front stages left for other inputs (another seed, same shapes) are not used.
TEST_CASE("kept forward: front stages left by a transition_forward or a forward_prepare" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const uint64_t seed = val::seed_from_env(1404);
  const std::vector<KeepCase> all = cases(seed);
  struct Mode {
    const char* name;
    bool transition, other_inputs, vouched;  // vouched: set_inputs_unchanged on around forward and backward
  };
  const Mode modes[] = {{"transition", true, false, false},
                        {"prepare", false, false, false},
                        {"prepare on other inputs", false, true, false},
                        {"transition, inputs vouched for", true, false, true},
                        {"prepare, inputs vouched for", false, false, true}};
  // gdn bf16 packed (folded: the transition runs no WY), gdn bf16 fused gate, gdn f32, kda bf16, gla f32
  // sms = 1 (kda): one multiprocessor assumed, so that the kept forward takes the transposed chain, and
  // after a forward_prepare (which left kg, for chunk_state.cu's chain) gets its WY again (kg^T). A kda
  // transition with 16-bit inputs runs the transposed chain and leaves kg^T: the kept forward after it
  // takes that chain whatever the multiprocessors (its WY as it is).
  for (const KeepCase& kc : {all[0], all[2], all[3], all[6 + 1], all[12 + 3]})
   for (const int sms : {0, 1}) {
    if (sms == 1 && kc.spec.variant != Variant::kda) continue;
    for (const Mode& m : modes) {
      const std::string name = kc.name() + " (" + m.name + (sms == 1 ? ", one multiprocessor" : "") + ")";
      SUBCASE(name.c_str()) {
        const Staged s = stage(*gpu, kc);
        KeepCase other = kc;
        other.spec.seed += 1000;
        const Staged s2 = stage(*gpu, other);
        cuda::Pipeline plain(gpu->queue()), kept(gpu->queue());
        kept.set_keep_forward(true);
        plain.set_multiprocessors(sms), kept.set_multiprocessors(sms);
        Inputs no_h0 = (m.other_inputs ? s2 : s).din.views;
        no_h0.initial_state = {};
        if (m.transition) {
          const Shape tshape = transition_shape(s.p.N, s.p.HV, s.p.K, s.p.V);
          const test::DeviceTensor ta = test::poisoned(*gpu, DType::f32, tshape), tb = test::poisoned(*gpu, DType::f32, tshape);
          plain.transition_forward(s.p, no_h0, 0, ta.view);
          kept.transition_forward(s.p, no_h0, 0, tb.view);
          check_same("transition_forward", test::to_host(*gpu, tb.view), test::to_host(*gpu, ta.view), name);
        } else {
          plain.forward_prepare(s.p, no_h0), kept.forward_prepare(s.p, no_h0);
        }
        kept.set_inputs_unchanged(m.vouched);  // no fingerprint, no read-back: the same reuse, the same bits
        Results a = run_forward(*gpu, plain, s), b = run_forward(*gpu, kept, s);
        CHECK(kept.kept_front_reuses() == (m.other_inputs ? 0 : 1));
        CHECK(plain.kept_front_reuses() == 0);
        check_same("o", b.o, a.o, name);
        if (kc.spec.final_state) check_same("final_state", b.ht, a.ht, name);
        run_backward(*gpu, plain, s, s.din.views, kc.qkv, a);
        run_backward(*gpu, kept, s, s.din.views, kc.qkv, b);
        kept.set_inputs_unchanged(false);
        CHECK(kept.kept_reuses() == 1);  // the record's fingerprint covers the initial state too
        CHECK(kept.kept_redos() == 0);
        const bool kgt_front = m.transition && kc.spec.variant == Variant::kda && kc.qkv != DType::f32 && kc.spec.V % 64 == 0;
        CHECK(kept.kda_chain_used() == (sms == 1 || kgt_front));
        check_grads_same(b, a, name);
      }
    }
   }
}

namespace {

uint64_t fingerprint(Backend& gpu, const TensorView& t, uint64_t salt) {
  test::DeviceTensor slot = test::device_tensor(gpu, DType::i64, {1});
  gpu.synchronize();  // the views' uploads, on the backend's queue, before the default stream reads them
  REQUIRE(cudaMemset(slot.view.data, 0, sizeof(uint64_t)) == cudaSuccess);
  cuda::launch_fingerprint_add(t, salt, static_cast<unsigned long long*>(slot.view.data), nullptr);
  uint64_t f = 0;
  REQUIRE(cudaMemcpy(&f, slot.view.data, sizeof f, cudaMemcpyDeviceToHost) == cudaSuccess);  // synchronizes
  return f;
}

}  // namespace

// The contiguous path reads words from memory; a column slice (strided rows) takes the gather path.
// Both must give one value for the same logical contents, rows of whole words or with a padded tail.
TEST_CASE("kept forward: the input fingerprint, strided and contiguous views of the same contents" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const uint64_t seed = val::seed_from_env(1403);
  for (DType dt : {DType::bf16, DType::f32, DType::f64})
    for (int64_t cols : {8, 7, 1}) {
      const std::string name = std::string(dtype_name(dt)) + " cols=" + std::to_string(cols) + " seed=" + std::to_string(seed);
      SUBCASE(name.c_str()) {
        Tensor<double> wide({2, 3, 5, 2 * cols + 3});
        const CounterRng rng{seed, uint64_t(cols)};
        for (int64_t i = 0; i < wide.numel(); ++i) wide.data()[i] = rng.normal(uint64_t(i));
        const test::DeviceTensor dw = test::to_device(*gpu, wide, dt);
        const TensorView slice = dw.view.narrow(3, 1, cols);  // rows 2 * cols + 3 apart: gathered
        Tensor<double> packed = to_tensor<double>(wide.view().narrow(3, 1, cols));
        const test::DeviceTensor dp = test::to_device(*gpu, packed, dt);
        const uint64_t f_slice = fingerprint(*gpu, slice, 3), f_packed = fingerprint(*gpu, dp.view, 3);
        INFO(name, ": slice ", f_slice, ", contiguous ", f_packed);
        CHECK(f_slice == f_packed);
        CHECK(fingerprint(*gpu, dp.view, 4) != f_packed);  // another role, another fingerprint
        packed(1, 2, 4, cols - 1) += 1.0;                  // one element, in the last (padded) word
        const test::DeviceTensor dc = test::to_device(*gpu, packed, dt);
        CHECK(fingerprint(*gpu, dc.view, 3) != f_packed);
      }
    }
}

// The kept forward fingerprints its inputs in one call (launch_fingerprint_add over several views):
// the contiguous views share a launch of at most 8 views, the others are gathered one by one; the sum
// must equal the single-view fingerprints' sum, over views of 2-, 4- and 8-byte elements, a strided
// one, an empty one and more contiguous views than one launch takes.
TEST_CASE("kept forward: the fingerprint of several views is the sum of theirs" * doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  const uint64_t seed = val::seed_from_env(1404);
  INFO("seed ", seed);
  const DType dts[] = {DType::bf16, DType::f32, DType::f64};
  std::vector<test::DeviceTensor> held;
  std::vector<TensorView> views;
  for (int i = 0; i < 11; ++i) {  // 10 of them contiguous rows of whole words
    Tensor<double> t({2, 3, 5, 8 + 8 * (i % 3)});
    const CounterRng rng{seed, uint64_t(i)};
    for (int64_t e = 0; e < t.numel(); ++e) t.data()[e] = rng.normal(uint64_t(e));
    held.push_back(test::to_device(*gpu, t, dts[i % 3]));
    views.push_back(i == 4 ? held.back().view.narrow(3, 1, 5) : held.back().view);  // i = 4: strided, gathered
  }
  views.push_back(TensorView{});  // empty: adds nothing
  std::vector<cuda::FingerprintInput> inputs;
  uint64_t want = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    inputs.push_back({&views[i], uint64_t(i + 1)});
    if (!views[i].empty()) want += fingerprint(*gpu, views[i], i + 1);
  }
  test::DeviceTensor slot = test::device_tensor(*gpu, DType::i64, {1});
  gpu->synchronize();
  REQUIRE(cudaMemset(slot.view.data, 0, sizeof(uint64_t)) == cudaSuccess);
  cuda::launch_fingerprint_add(inputs, static_cast<unsigned long long*>(slot.view.data), nullptr);
  uint64_t got = 0;
  REQUIRE(cudaMemcpy(&got, slot.view.data, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == want);
  CHECK(got != 0);
}
