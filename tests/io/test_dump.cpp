// The dump schema: every golden file (version 1) reads, and rewriting it as version 2 keeps every
// tensor bit for bit; the decoded call matches the golden README; a failed write leaves no file
// behind; per-rank placement (schema v2) and the local cu_seqlens of a chunkwise CP shard.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/dump_call.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

using namespace kcp;

namespace {

std::vector<std::string> golden_files() {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  REQUIRE_MESSAGE(src, "KCP_SOURCE_DIR is set by ctest");
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(src) / "data/golden"))
    if (e.path().extension() == ".h5") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Attribute maps equal value for value, NaN (FLA's "None" for lower_bound) equal to NaN.
bool same_attrs(const io::Attributes& a, const io::Attributes& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) return false;
    const double* x = std::get_if<double>(&v);
    const double* y = std::get_if<double>(&it->second);
    if (x && y && std::isnan(*x) && std::isnan(*y)) continue;
    if (!(v == it->second)) return false;
  }
  return true;
}

void check_same_dump(const io::Dump& a, const io::Dump& b) {
  REQUIRE(a.groups.size() == b.groups.size());
  for (size_t g = 0; g < a.groups.size(); ++g) {
    const io::DumpGroup &ga = a.groups[g], &gb = b.groups[g];
    CHECK(ga.name == gb.name);
    REQUIRE(ga.datasets.size() == gb.datasets.size());
    for (size_t i = 0; i < ga.datasets.size(); ++i) {
      const io::DumpDataset &x = ga.datasets[i], &y = gb.datasets[i];
      INFO(ga.name, "/", x.name);
      CHECK(x.name == y.name);
      CHECK(x.source == y.source);
      CHECK(x.encoding == y.encoding);
      io::Attributes want = x.attrs;  // version 2 adds the encoding attribute
      want["encoding"] = std::string(io::encoding_name(x.encoding));
      CHECK(same_attrs(want, y.attrs));
      REQUIRE(x.data.dtype == y.data.dtype);
      REQUIRE(x.data.shape == y.data.shape);
      CHECK(std::memcmp(x.data.data(), y.data.data(), x.data.nbytes()) == 0);
    }
  }
}

// Tokens [t0, t1) of a [1,T,...] array (axis 1), as a CP rank holds them.
io::Array slice_tokens(const io::Array& a, int64_t t0, int64_t t1) {
  Shape s = a.shape;
  const size_t row = a.nbytes() / size_t(s[1]);
  s[1] = t1 - t0;
  io::Array out(a.dtype, s);
  std::memcpy(out.data(), static_cast<const char*>(a.data()) + size_t(t0) * row, out.nbytes());
  return out;
}

}  // namespace

TEST_CASE("golden files read, and a version-2 rewrite keeps every tensor and attribute") {
  test::TempDir dir("dump_golden");
  for (const std::string& path : golden_files()) {
    SUBCASE(std::filesystem::path(path).filename().string().c_str()) {
      const io::Dump d = io::dump_read(path);
      CHECK(d.version == 1);
      const std::string out = dir.file("rewritten.h5");
      io::dump_write(out, d);
      const io::Dump r = io::dump_read(out);
      CHECK(r.version == io::kDumpVersion);
      io::Attributes expect = d.attrs;
      expect["format_version"] = io::kDumpVersion;
      CHECK(same_attrs(r.attrs, expect));
      check_same_dump(d, r);
    }
  }
}

TEST_CASE("gdn_bf16_varlen decodes to the call the golden README describes") {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  REQUIRE(src);
  const io::Dump d = io::dump_read(std::string(src) + "/data/golden/gdn_bf16_varlen.h5");
  const io::OpCall c = io::dump_op_call(d, DType::f64);
  // README: lens 50,100,1,77 packed, H = HV = 2, K = V = 32, initial state, bf16 inputs
  CHECK(c.problem.cu_seqlens == std::vector<int64_t>{0, 50, 150, 151, 228});
  CHECK(c.problem.N == 4);
  CHECK(c.problem.HV == 2);
  CHECK(c.input_dtype == DType::bf16);
  CHECK(!c.inputs.initial_state.empty());
  CHECK(!c.cotangents.d_o.empty());
  CHECK(c.placement.describe() == "single rank");
}

TEST_CASE("a failed write leaves neither the target nor a temporary file") {
  test::TempDir dir("dump_atomic");
  val::CaseSpec s;
  s.seed = val::seed_from_env(3);
  io::Dump d = test::dump_from_case(val::make_case(s));
  const std::string target = dir.file("out.h5");
  io::dump_write(target, d);  // a good file first: a failed overwrite must keep it
  const auto size_before = std::filesystem::file_size(target);
  d.groups[0].add("bad/name", test::array_of(val::make_case(s).q, DType::f32), DType::f32);  // no group "bad"
  CHECK_THROWS_AS(io::dump_write(target, d), Error);
  CHECK(dir.count() == 1);
  CHECK(std::filesystem::file_size(target) == size_before);
  CHECK(io::dump_read(target).group("inputs")->find("bad/name") == nullptr);
  CHECK_THROWS_AS(io::dump_write(dir.file("no_such_folder/out.h5"), d), Error);
  CHECK(dir.count() == 1);
}

TEST_CASE("a case written as a dump decodes to the same problem, in every input dtype") {
  test::TempDir dir("dump_case");
  val::CaseSpec s;
  s.variant = Variant::kda, s.seqlens = {5, 1, 9}, s.H = 1, s.HV = 2, s.K = 8, s.V = 4;
  s.flags.use_gate_in_kernel = true, s.flags.lower_bound = -5.0, s.flags.safe_gate = true;
  s.flags.state_v_first = true, s.seed = val::seed_from_env(4);
  const val::CaseData c = val::make_case(s);
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    SUBCASE(std::string(dtype_name(t)).c_str()) {
      io::dump_write(dir.file("c.h5"), test::dump_from_case(c, t, io::Encoding::bf16_bits));
      const io::OpCall call = io::dump_op_call(io::dump_read(dir.file("c.h5")), DType::f64);
      const Problem want = c.problem();
      CHECK(call.problem.describe() == want.describe());
      CHECK(call.problem.cu_seqlens == want.cu_seqlens);
      CHECK(call.problem.flags.safe_gate);
      CHECK(call.inputs.q.dtype == t);
      CHECK(call.input_dtype == t);
    }
  }
}

TEST_CASE("schema v2 placement: a chunkwise shard gets its local cu_seqlens from the global one") {
  test::TempDir dir("dump_placement");
  val::CaseSpec s;
  s.seqlens = {7, 5}, s.initial_state = false, s.final_state = false, s.seed = val::seed_from_env(5);
  const val::CaseData c = val::make_case(s);
  io::Dump d = test::dump_from_case(c);
  // rank 1 of 2 owns packed tokens [6, 12): one token of sequence 0, then sequence 1 (ALGORITHMS.md 5.1)
  io::DumpGroup& in = d.groups.at(0);  // /inputs, the only group
  for (io::DumpDataset& ds : in.datasets) {
    if (ds.name == "cu_seqlens") ds.attrs["scope"] = std::string("global");
    else ds.data = slice_tokens(ds.data, 6, 12);
  }
  d.attrs["cp_size"] = int64_t(2), d.attrs["cp_rank"] = int64_t(1), d.attrs["cp_mode"] = std::string("chunkwise");
  d.attrs["token_offset"] = int64_t(6), d.attrs["cp_pre_num_ranks"] = int64_t(1);
  d.attrs["cp_post_num_ranks"] = int64_t(0), d.attrs["cp_pre_num_conv_tokens"] = int64_t(6);
  io::dump_write(dir.file("rank1.h5"), d);
  const io::OpCall call = io::dump_op_call(io::dump_read(dir.file("rank1.h5")), DType::f64);
  CHECK(call.problem.cu_seqlens == std::vector<int64_t>{0, 1, 6});
  CHECK(!call.placement.is_first_rank);
  CHECK(call.placement.is_last_rank);
  CHECK(!call.placement.forward_self_contained());
  CHECK(call.placement.describe() == "tp 0/1, cp 1/2 chunkwise, tokens from 6");
}
