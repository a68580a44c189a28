// What cuda-chunkwise promises without running a kernel, so it runs on CI (no GPU): supports() is
// derived from the instantiated head sizes and states every limit; backward and
// transition_backward are supported with the forward and reject host views; host views are rejected by name before any
// CUDA call. The registry's cuda-chunkwise (shape adapter, core/padded_backend.h) accepts K = 16 .. 128, any V and
// chunk_size 32, and names the K <= 128 limit (its kernels: tests/cuda/test_cuda_shapes.cpp). The chunk
// table's closed form (cuda/chunk_table.h) on layouts that have one and layouts that do not. The
// forward's schedule in words (cuda/chunkwise.h ForwardSchedule, `kcp bench --explain`), and the reading
// of KCP_CUDA_KDA_WINDOW (cuda/env_switches.h). The admission of one-launch kda chains
// (cuda/spinning_chains.h): the limit, the counting until done, one entry per owner. The folded state
// kernel's automatic block layout and KCP_CUDA_STATE_GROUPS (cuda/fold_layout.h).
#include <doctest/doctest.h>

#include <vector>

#include "core/padded_backend.h"
#include "cuda/backend_cuda.h"
#include "cuda/chunk_table.h"
#include "cuda/chunkwise.h"
#include "cuda/env_switches.h"
#include "cuda/fold_layout.h"
#include "cuda/key_dims.h"
#include "cuda/spinning_chains.h"
#include "validation/cases.h"
#include "validation/registry.h"

using namespace kcp;

namespace {

Problem problem(Variant var, int64_t K, int64_t V, int64_t chunk = 64, DType compute = DType::f32) {
  val::CaseSpec s;
  s.variant = var, s.K = K, s.V = V, s.chunk_size = chunk, s.T = 5;
  return val::make_case(s).problem(compute);
}

}  // namespace

TEST_CASE("supports() matches the instantiated kernels and names every limit") {
  auto be = cuda::make_cuda_backend();
  CHECK(be->name() == "cuda-chunkwise");
  CHECK(be->device() == Device::cuda);
  for (int64_t K : {16, 32, 48, 64, 96, 128, 256}) {
    INFO("K = ", K);
    CHECK(bool(be->supports(problem(Variant::gdn, K, 32))) == cuda::key_dim_supported(K));
    CHECK(bool(be->supports(problem(Variant::kda, K, 64))) == cuda::key_dim_supported(K));
  }
  const Support no_v = be->supports(problem(Variant::gdn, 64, 48));
  CHECK(!no_v);
  CHECK(no_v.reason.find("multiple of") != std::string::npos);
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla}) {  // the backward follows the forward
    INFO(variant_name(var));
    CHECK(be->supports(problem(var, 64, 64)));
    CHECK(be->supports_backward(problem(var, 64, 64)));
    CHECK(!be->supports_backward(problem(var, 64, 48)));
  }
  CHECK(!be->supports(problem(Variant::gdn, 64, 64, 32)));
  CHECK(!be->supports(problem(Variant::gdn, 64, 64, 64, DType::f64)));
  CHECK(be->supports(problem(Variant::kda, 128, 128)));
}

TEST_CASE("backward and transition_backward are supported where the forward is, and reject host views by name") {
  auto be = cuda::make_cuda_backend();
  const val::CaseData c = [] {
    val::CaseSpec s;
    s.K = s.V = 32;
    return val::make_case(s);
  }();
  const Problem p = c.problem(DType::f32);
  CHECK(be->supports(p));
  CHECK(be->supports_backward(p));
  CHECK_FALSE(be->supports_backward(problem(Variant::gdn, 64, 64, 32)));
  auto g = val::make_grads<float>(p, c.inputs());
  CHECK_THROWS_WITH_AS(be->backward(p, c.inputs(), c.cotangents(), g.views()),
                       doctest::Contains("q must be a CUDA device view"), Error);
  CHECK_THROWS_WITH_AS(be->transition_backward(p, c.inputs(), c.d_o.view(), 0, {}),
                       doctest::Contains("q must be a CUDA device view"), Error);
}

TEST_CASE("host views are rejected with the argument's name") {
  auto be = cuda::make_cuda_backend();
  val::CaseSpec s;
  s.K = s.V = 32;
  const val::CaseData c = val::make_case(s);
  const Problem p = c.problem(DType::f32);
  auto out = val::make_outputs<float>(p, true);
  CHECK_THROWS_WITH_AS(be->forward(p, c.inputs(), out.views()), doctest::Contains("q must be a CUDA device view"), Error);
  CHECK(be->explain_last_forward().empty());  // a rejected forward picked no kernels
}

// The words `kcp bench --explain` prints for a forward's schedule (the GPU case in test_cuda_forward.cpp
// checks that a forward records what it ran).
TEST_CASE("a forward's schedule in words") {
  cuda::ForwardSchedule s;
  CHECK(s.describe() == "no state stage ran");
  s.state = "chunk_state_fold";
  CHECK(s.describe() == "state chunk_state_fold");
  s.fold = {1, 1};
  CHECK(s.describe() == "state chunk_state_fold (1 warpgroup x 16 columns)");
  s.fold = {2, 2}, s.kept = true;
  CHECK(s.describe() == "state chunk_state_fold (2 warpgroups x 32 columns), kept");
  s.fold = {0, 0}, s.kept = false;
  s.state = "chunk_state_kda", s.chain_blocks = 32, s.windows = 4, s.window_chunks = 128, s.kept = true;
  CHECK(s.describe() == "state chunk_state_kda (32 blocks), 4 windows of 128 chunks (kkt, WY beside the chain, the chain in "
                        "one launch), kept");
  s.chain_per_window = true;
  CHECK(s.describe().find("4 windows of 128 chunks (kkt, WY beside the chain, a chain launch per window)") != std::string::npos);
  s.windows = 0, s.front_reused = true;
  CHECK(s.describe() == "state chunk_state_kda (32 blocks), kept (front stages reused)");
}

TEST_CASE("the registry's cuda-chunkwise accepts padded shapes and names the K limit") {
  auto be = val::backend_create("cuda-chunkwise");
  auto problem = [](Variant var, int64_t K, int64_t V, int64_t C) {
    val::CaseSpec s;
    s.variant = var, s.K = K, s.V = V, s.chunk_size = C, s.T = 5;
    return val::make_case(s).problem(DType::f32);
  };
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (int64_t K : {16, 48, 96, 128})
      for (int64_t V : {16, 40, 72})
        for (int64_t C : {32, 64}) {
          INFO(variant_name(var), " K=", K, " V=", V, " C=", C);
          CHECK(be->supports(problem(var, K, V, C)));
          CHECK(bool(be->supports_backward(problem(var, K, V, C))) ==
                bool(be->supports_backward(problem(var, 64, 64, 64))));
        }
  const Support k256 = be->supports(problem(Variant::gdn, 256, 64, 64));
  CHECK(!k256);
  CHECK(k256.reason.find("K <= 128") != std::string::npos);
  CHECK(!be->supports(problem(Variant::kda, 256, 40, 32)));
  CHECK(dynamic_cast<PaddedBackend&>(*be).plan(problem(Variant::kda, 48, 40, 32)).describe() ==
        "pad K 48->64, V 40->64; chunk 32->64");
}

// The chunk table and its closed form (cuda/chunk_table.h): found where every sequence has one
// length and they lie back to back, refused otherwise, and where found equal to the table entry by
// entry (closed_form checks that itself; here the layouts that must and must not have one).
TEST_CASE("chunk table: the closed form where the sequences have one length") {
  struct Layout {
    const char* name;
    std::vector<int64_t> starts, lens;
    bool closed;
  };
  const Layout layouts[] = {
      {"B = 2 sequences of 130 tokens", {0, 130}, {130, 130}, true},
      {"packed 3 x 192", {0, 192, 384}, {192, 192, 192}, true},
      {"one sequence of 1 token", {0}, {1}, true},
      {"a CP rank's second sequence alone", {130}, {130}, true},
      {"mixed lengths", {0, 200, 201, 201}, {200, 1, 0, 130}, false},
      {"an empty first sequence", {0, 0}, {0, 64}, false},
      {"equal lengths, not back to back", {0, 200}, {130, 130}, false},
      {"equal chunk counts, other lengths", {0, 100}, {100, 120}, false},
      {"no sequences", {}, {}, false},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    std::vector<int> seq0;
    const std::vector<cuda::ChunkInfo> chunks = cuda::chunks_of(l.starts, l.lens, seq0);
    REQUIRE(seq0.size() == l.starts.size() + 1);
    const cuda::ChunkGrid g = cuda::closed_form(chunks);
    CHECK((g.len > 0) == l.closed);
    for (size_t i = 0; g.len > 0 && i < chunks.size(); ++i) {
      const cuda::ChunkInfo a = cuda::grid_entry(g, int(i));
      CHECK(a.seq == chunks[i].seq);
      CHECK(a.t0 == chunks[i].t0);
      CHECK(a.len == chunks[i].len);
      CHECK(a.index_in_seq == chunks[i].index_in_seq);
    }
  }
}

TEST_CASE("KCP_CUDA_KDA_WINDOW: auto, off or a count; anything else an error naming the variable") {
  CHECK(cuda::window_chunks_setting(nullptr) == -1);
  CHECK(cuda::window_chunks_setting("") == -1);
  CHECK(cuda::window_chunks_setting("auto") == -1);
  CHECK(cuda::window_chunks_setting("off") == 0);
  CHECK(cuda::window_chunks_setting("0") == 0);
  CHECK(cuda::window_chunks_setting("32") == 32);
  for (const char* bad : {"12x", "-1", "abc", "3.5", "99999999999"}) {
    INFO(bad);
    CHECK_THROWS_WITH_AS(cuda::window_chunks_setting(bad), doctest::Contains("KCP_CUDA_KDA_WINDOW="), Error);
  }
}

// The model's arithmetic on 132 multiprocessors (fold_layout.h: waves x step time, 1.37 / 1.99 / 3.38
// us for 16 / 32 / 64 columns a block), each expectation worked by hand below.
TEST_CASE("folded state kernel: the automatic layout, waves times step time") {
  using cuda::automatic_fold_layout;
  auto is = [](cuda::FoldLayout f, int g, int w) { return f.groups == g && f.warpgroups == w; };
  // 16 heads, V = 128: 128 blocks of 16 (one wave, 1.37) against 64 of 32 (1.99), 32 of 64 (3.38)
  CHECK(is(automatic_fold_layout(128, 16, 132), 1, 1));
  // 32 heads: 256 blocks of 16 are two waves (2.74); 128 of 32 one (1.99); 64 of 64 (3.38)
  CHECK(is(automatic_fold_layout(128, 32, 132), 2, 1));
  // 64 heads: 4 waves of 16 (5.48), 2 of 32 (3.98), 1 of 64 (3.38)
  CHECK(is(automatic_fold_layout(128, 64, 132), 2, 2));
  // a transition's V + K = 256 columns of 16 heads: 256 blocks of 16 (2.74), 128 of 32 (1.99)
  CHECK(is(automatic_fold_layout(256, 16, 132), 2, 1));
  // V = 96 has no 64-column blocks: of 64 heads, 3 waves of 16 (4.11) against 2 of 32 (3.98)
  CHECK(is(automatic_fold_layout(96, 64, 132), 2, 1));
  // one multiprocessor (the tests' set_multiprocessors(1)): every block a wave, the widest wins
  CHECK(is(automatic_fold_layout(128, 1, 1), 2, 2));
}

TEST_CASE("KCP_CUDA_STATE_GROUPS: auto, 1, 2 or 2x2; anything else an error naming the variable") {
  for (const char* a : {(const char*)nullptr, "", "auto"}) CHECK(cuda::parse_fold_layout(a).groups == 0);
  CHECK(cuda::parse_fold_layout("1").groups == 1);
  CHECK(cuda::parse_fold_layout("2").warpgroups == 1);
  CHECK(cuda::parse_fold_layout("2x2").warpgroups == 2);
  for (const char* bad : {"3", "1x4", "2x", "x"}) {
    INFO(bad);
    CHECK_THROWS_WITH_AS(cuda::parse_fold_layout(bad), doctest::Contains("KCP_CUDA_STATE_GROUPS="), Error);
  }
}

TEST_CASE("spinning chains: admitted within the limit, counted until done, an owner's later chain in place of its earlier") {
  cuda::SpinningChains chains;
  int a = 0, b = 0, c = 0;  // owners
  bool a_done = false;
  REQUIRE(chains.admit(0, &a, 32, 66));
  CHECK(chains.in_flight(0) == 32);  // admitted, not yet queued: it counts
  chains.launched(&a, [&a_done] { return a_done; });
  CHECK(chains.admit(0, &b, 32, 66));   // 64 <= 66
  CHECK_FALSE(chains.admit(0, &c, 8, 66));  // 72 > 66: nothing recorded for c
  CHECK(chains.in_flight(0) == 64);
  CHECK(chains.admit(1, &c, 8, 66));    // another device's chains do not count
  CHECK(chains.admit(0, &a, 32, 66));   // a's next chain replaces its earlier one (its own stream orders them)
  CHECK(chains.in_flight(0) == 64);
  chains.launched(&a, [&a_done] { return a_done; });
  a_done = true;
  CHECK(chains.in_flight(0) == 32);     // a has finished; b has not been launched
  CHECK(chains.admit(0, &c, 34, 66));
  chains.release(&b);
  chains.release(&c);
  CHECK(chains.in_flight(0) == 0);
  CHECK(chains.in_flight(1) == 0);
}
