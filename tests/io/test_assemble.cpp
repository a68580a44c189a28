// dump_assemble: per-rank shards of a dump, split along tokens (chunkwise CP) or heads (headwise
// CP / TP), reassemble to the original bit for bit (inputs and results, partial sums included), and
// decode to the global problem; incomplete or inconsistent shard sets are refused.
#include <doctest/doctest.h>

#include <cstring>

#include "core/rng.h"
#include "io/dump_assemble.h"
#include "io/dump_call.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

using namespace kcp;

namespace {

// A result group with seeded values of the shapes the call's results have (assembly is structural).
void add_results(io::Dump& d, uint64_t seed) {
  const io::OpCall c = io::dump_op_call(d, DType::f64);
  const Problem& p = c.problem;
  io::DumpGroup& g = d.add_group("fla_chunk");
  std::vector<std::pair<const char*, Shape>> shapes = {{"o", shape_v(p)}, {"dq", shape_qk(p)}, {"dk", shape_qk(p)},
                                                       {"dv", shape_v(p)}, {"dg", shape_g(p)}, {"dbeta", shape_beta(p)}};
  if (!c.inputs.initial_state.empty()) shapes.push_back({"dinitial_state", shape_state(p)});
  if (!c.inputs.initial_state.empty()) shapes.push_back({"final_state", shape_state(p)});
  if (!c.inputs.A_log.empty()) shapes.push_back({"dA_log", {p.HV}});
  if (!c.inputs.dt_bias.empty()) shapes.push_back({"ddt_bias", shape_dt_bias(p)});
  uint64_t stream = 0;
  for (const auto& [name, s] : shapes) {
    Tensor<double> t(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = CounterRng{seed, ++stream}.normal(uint64_t(i));
    g.add(name, test::array_of(t, DType::f32), DType::f32);
  }
}

void check_equal(const io::Dump& a, const io::Dump& b) {
  for (const io::DumpGroup& ga : a.groups) {
    const io::DumpGroup* gb = b.group(ga.name);
    REQUIRE(gb);
    CHECK(ga.datasets.size() == gb->datasets.size());
    for (const io::DumpDataset& x : ga.datasets) {
      INFO(ga.name, "/", x.name);
      const io::DumpDataset* y = gb->find(x.name);
      REQUIRE(y);
      REQUIRE(x.data.shape == y->data.shape);
      CHECK(std::memcmp(x.data.data(), y->data.data(), x.data.nbytes()) == 0);
    }
  }
}

io::Dump roundtrip(const io::Dump& d, const test::TempDir& dir, const std::string& name) {
  io::dump_write(dir.file(name), d);
  return io::dump_read(dir.file(name));
}

}  // namespace

TEST_CASE("chunkwise shards reassemble along tokens, partial sums added") {
  test::TempDir dir("assemble_tokens");
  val::CaseSpec s;
  s.variant = Variant::gdn, s.seqlens = {7, 9}, s.H = s.HV = 2, s.K = s.V = 4;
  s.initial_state = s.final_state = false, s.flags.use_gate_in_kernel = true, s.seed = val::seed_from_env(21);
  io::Dump global = test::dump_from_case(val::make_case(s));
  add_results(global, s.seed);
  std::vector<io::Dump> shards;
  for (int64_t r = 0; r < 2; ++r) shards.push_back(roundtrip(test::dump_shard(global, r, 2, true), dir, "r.h5"));
  CHECK(io::dump_op_call(shards[1], DType::f64).problem.cu_seqlens == std::vector<int64_t>{0, 8});
  CHECK(!io::dump_placement(shards[1]).is_first_rank);
  const io::Dump g = io::dump_assemble({shards[1], shards[0]});  // any order
  check_equal(global, g);
  CHECK(io::dump_op_call(g, DType::f64).problem.describe() ==
        io::dump_op_call(global, DType::f64).problem.describe());
  CHECK(io::dump_placement(g).forward_self_contained());
  CHECK(io::dump_placement(g).backward_self_contained());
}

TEST_CASE("headwise / TP shards reassemble along heads, GVA and states included") {
  test::TempDir dir("assemble_heads");
  val::CaseSpec s;
  s.variant = Variant::kda, s.B = 2, s.T = 9, s.H = 2, s.HV = 4, s.K = s.V = 4;
  s.flags.use_gate_in_kernel = true, s.seed = val::seed_from_env(22);
  io::Dump global = test::dump_from_case(val::make_case(s));
  add_results(global, s.seed);
  std::vector<io::Dump> shards;
  for (int64_t r = 0; r < 2; ++r) shards.push_back(roundtrip(test::dump_shard(global, r, 2, false), dir, "r.h5"));
  CHECK(io::dump_op_call(shards[0], DType::f64).problem.HV == 2);  // a shard is a complete call by itself
  check_equal(global, io::dump_assemble(shards));
}

TEST_CASE("incomplete or inconsistent shard sets are refused") {
  val::CaseSpec s;
  s.seqlens = {8, 8}, s.initial_state = s.final_state = false, s.seed = val::seed_from_env(23);
  const io::Dump global = test::dump_from_case(val::make_case(s));
  const io::Dump r0 = test::dump_shard(global, 0, 2, true), r1 = test::dump_shard(global, 1, 2, true);
  CHECK_THROWS_WITH_AS(io::dump_assemble({r0}), doctest::Contains("expected tp_size * cp_size = 2"), Error);
  CHECK_THROWS_WITH_AS(io::dump_assemble({r0, r0}), doctest::Contains("missing or repeated"), Error);
  io::Dump other = r1;
  other.op = "kda", other.attrs["op"] = std::string("kda");
  CHECK_THROWS_WITH_AS(io::dump_assemble({r0, other}), doctest::Contains("differ from"), Error);
  io::Dump heads = test::dump_shard(global, 1, 2, false);
  CHECK_THROWS_AS(io::dump_assemble({r0, heads}), Error);
}

namespace {

// Mutable access for the test below: /inputs/<name> of a dump, and an int64 index vector.
io::DumpDataset& input_of(io::Dump& d, const std::string& name) {
  for (io::DumpGroup& g : d.groups)
    if (g.name == "inputs")
      for (io::DumpDataset& x : g.datasets)
        if (x.name == name) return x;
  throw Error("no /inputs/" + name);
}
io::Array index_array(std::vector<double> v) {
  Tensor<double> t({int64_t(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data()[i] = v[i];
  return test::array_of(t, DType::i64);
}

}  // namespace

TEST_CASE("chunkwise shards need the global cu_seqlens, consistent with cu_seqlens_local") {
  val::CaseSpec s;
  s.seqlens = {5, 11}, s.initial_state = s.final_state = false, s.seed = val::seed_from_env(24);
  const io::Dump global = test::dump_from_case(val::make_case(s));
  auto shards = [&] {  // as kcp_dump writes them: FLA's rank-local cu_seqlens next to the global one
    std::vector<io::Dump> r = {test::dump_shard(global, 0, 2, true), test::dump_shard(global, 1, 2, true)};
    for (int k = 0; k < 2; ++k)
      for (io::DumpGroup& g : r[size_t(k)].groups)
        if (g.name == "inputs") g.add("cu_seqlens_local", index_array(k == 0 ? std::vector<double>{0, 5, 8}
                                                                              : std::vector<double>{0, 8}), DType::i64);
    return r;
  };
  const io::Dump g = io::dump_assemble(shards());
  CHECK(g.inputs().find("cu_seqlens_local") == nullptr);
  CHECK(io::dump_op_call(g, DType::f64).problem.cu_seqlens == std::vector<int64_t>{0, 5, 16});

  std::vector<io::Dump> r = shards();  // only the local one: the assembly would hold one sequence
  for (io::Dump& d : r)
    for (io::DumpGroup& gr : d.groups) std::erase_if(gr.datasets, [](auto& x) { return x.name == "cu_seqlens"; });
  CHECK_THROWS_WITH_AS(io::dump_assemble(r), doctest::Contains("needs the global cu_seqlens"), Error);
  r = shards();
  for (io::Dump& d : r) input_of(d, "cu_seqlens").attrs["scope"] = std::string("local");
  CHECK_THROWS_WITH_AS(io::dump_assemble(r), doctest::Contains("scope 'local'"), Error);
  r = shards();
  input_of(r[1], "cu_seqlens_local").data = index_array({0, 3, 8});
  CHECK_THROWS_WITH_AS(io::dump_assemble(r), doctest::Contains("cut to this rank's tokens [8, 16)"), Error);
  r = shards();
  for (io::Dump& d : r) input_of(d, "cu_seqlens").data = index_array({0, 5, 15});
  CHECK_THROWS_WITH_AS(io::dump_assemble(r), doctest::Contains("shards hold tokens [0, 16)"), Error);
}
