// Bad dumps: each must give one kcp::Error naming the file and the dataset or attribute at fault,
// never a crash (this file also runs under AddressSanitizer/UBSan as test_io_asan): not HDF5,
// empty, truncated anywhere, missing dataset or group, contradicting shapes or size attributes,
// unknown op / version / dtype label, flags of the wrong type, NaN/Inf inputs, bad cu_seqlens.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "io/dump_call.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

using namespace kcp;

namespace {

io::Dump good_dump(Variant var = Variant::gdn) {
  val::CaseSpec s;
  s.variant = var, s.seqlens = {9, 4}, s.K = 8, s.V = 4, s.seed = val::seed_from_env(7);
  return test::dump_from_case(val::make_case(s));
}

void decode(const std::string& path) {
  const io::Dump d = io::dump_read(path);
  if (d.op == "conv1d") io::dump_conv1d_call(d);
  else io::dump_op_call(d, DType::f64);
}

io::DumpDataset& input(io::Dump& d, const char* name) {
  for (io::DumpDataset& ds : d.groups.at(0).datasets)
    if (ds.name == name) return ds;
  FAIL("no input ", name);
  throw 0;
}

void drop(io::Dump& d, const char* name) {
  std::erase_if(d.groups.at(0).datasets, [&](const io::DumpDataset& x) { return x.name == name; });
}

void set_value(io::DumpDataset& ds, int64_t i, double v) { ds.data.view().set(i, v); }

struct BadCase {
  const char* name;
  std::function<void(io::Dump&)> mutate;
  const char* expect;  // the object the message must name, after "<file>: "
  io::Attributes root_patch = {};  // written into the file afterwards (dump_write fixes format and version)
};

void patch_root(const std::string& path, const io::Attributes& attrs) {
  if (attrs.empty()) return;
  io::H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  REQUIRE(f.get() >= 0);
  io::attrs_write(f.get(), attrs, path);
}

}  // namespace

TEST_CASE("every kind of bad dump is one error naming the file and the object") {
  test::TempDir dir("bad_input");
  const std::string path = dir.file("bad.h5");
  const BadCase cases[] = {
      {"missing dataset", [](io::Dump& d) { drop(d, "v"); },
       "/inputs/v: missing"},
      {"missing /inputs", [](io::Dump& d) { d.groups[0].name = "inputz"; }, "/inputs: missing"},
      {"shape contradicts the others", [](io::Dump& d) { input(d, "k").data.shape[1] -= 1; },
       "/inputs/k: expected shape"},
      {"size attribute contradicts the tensors", [](io::Dump& d) { d.attrs["T"] = int64_t(99); }, "attribute T"},
      {"unknown op", [](io::Dump& d) { d.attrs["op"] = std::string("mamba"); }, "attribute op: unknown op 'mamba'"},
      {"unknown format version", [](io::Dump&) {}, "attribute format_version: unknown format version 3",
       {{"format_version", int64_t(3)}}},
      {"not a kcp dump", [](io::Dump&) {}, "not a kcp dump", {{"format", std::string("other")}}},
      {"flag as a string", [](io::Dump& d) { d.attrs["use_gate_in_kernel"] = std::string("yes"); },
       "attribute use_gate_in_kernel: expected a boolean"},
      {"flag as the integer 2", [](io::Dump& d) { d.attrs["safe_gate"] = int64_t(2); }, "attribute safe_gate"},
      {"flag as a number", [](io::Dump& d) { d.attrs["use_qk_l2norm_in_kernel"] = 1.0; },
       "attribute use_qk_l2norm_in_kernel"},
      {"scale as a string", [](io::Dump& d) { d.attrs["scale"] = std::string("auto"); }, "attribute scale"},
      {"NaN in an input", [](io::Dump& d) { set_value(input(d, "q"), 17, NAN); }, "/inputs/q: non-finite value nan"},
      {"Inf in a cotangent", [](io::Dump& d) { set_value(input(d, "do"), 3, INFINITY); }, "/inputs/do: non-finite"},
      {"cu_seqlens of floats",
       [](io::Dump& d) { auto& c = input(d, "cu_seqlens"); c.data = io::array_convert(c.data, DType::f32); },
       "/inputs/cu_seqlens: expected a 1-d integer"},
      {"cu_seqlens not ending at T", [](io::Dump& d) { set_value(input(d, "cu_seqlens"), 2, 12); },
       "/inputs/cu_seqlens: must end at T"},
      {"lower_bound on gdn", [](io::Dump& d) { d.attrs["lower_bound"] = -5.0; }, "attribute lower_bound"},
      {"integer q",
       [](io::Dump& d) {
         io::DumpDataset& q = input(d, "q");
         q.data = io::array_convert(q.data, DType::i32), q.source = DType::i32;
       },
       "/inputs/q: expected a floating-point"},
      {"dht without do", [](io::Dump& d) { drop(d, "do"); },
       "/inputs/dht: given without do"},
  };
  for (const BadCase& c : cases) {
    SUBCASE(c.name) {
      io::Dump d = good_dump();
      c.mutate(d);
      io::dump_write(path, d);
      patch_root(path, c.root_patch);
      CHECK_THROWS_WITH_AS(decode(path), doctest::Contains((path + ": " + c.expect).c_str()), Error);
    }
  }
  SUBCASE("a good dump decodes (the cases above fail for their own reason)") {
    io::dump_write(path, good_dump());
    CHECK_NOTHROW(decode(path));
  }
}

TEST_CASE("an unknown dtype label and an unlabelled 2-byte integer are refused") {
  test::TempDir dir("bad_dtype");
  const std::string path = dir.file("bad.h5");
  io::Dump d = good_dump();
  io::dump_write(path, d);
  {  // relabel after writing: dataset_write always writes dtype = source
    io::H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    io::H5Id ds(H5Dopen2(f.get(), "inputs/g", H5P_DEFAULT), H5Dclose);
    io::attrs_write(ds.get(), {{"dtype", std::string("bfloat17")}}, path);
  }
  const std::string label = path + ": /inputs/g: attribute dtype: unknown dtype 'bfloat17'";
  CHECK_THROWS_WITH_AS(decode(path), doctest::Contains(label.c_str()), Error);
  io::Dump e = good_dump();
  io::DumpDataset& q = input(e, "q");
  q.data = io::array_convert(q.data, DType::bf16), q.source = DType::bf16, q.encoding = io::Encoding::bf16_bits;
  io::dump_write(path, e);
  {
    io::H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    io::H5Id ds(H5Dopen2(f.get(), "inputs/q", H5P_DEFAULT), H5Dclose);
    REQUIRE(H5Adelete(ds.get(), "dtype") >= 0);
  }
  const std::string bits = path + ": /inputs/q: a 2-byte integer dataset needs";
  CHECK_THROWS_WITH_AS(decode(path), doctest::Contains(bits.c_str()), Error);
}

TEST_CASE("files that are not HDF5, empty, or truncated anywhere are refused without a crash") {
  test::TempDir dir("bad_files");
  const std::string good = dir.file("good.h5");
  io::dump_write(good, good_dump(Variant::kda));
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string bad = dir.file("bad.h5");
  auto write_bytes = [&](const std::string& b) {
    std::ofstream out(bad, std::ios::binary | std::ios::trunc);
    out.write(b.data(), std::streamsize(b.size()));
  };
  write_bytes("this is a text file, not HDF5\n");
  CHECK_THROWS_WITH_AS(decode(bad), doctest::Contains((bad + ": not an HDF5 file").c_str()), Error);
  write_bytes("");
  CHECK_THROWS_WITH_AS(decode(bad), doctest::Contains((bad + ": ").c_str()), Error);
  for (int part = 1; part < 32; ++part) {
    const size_t cut = bytes.size() * size_t(part) / 32;
    INFO("truncated to ", cut, " of ", bytes.size(), " bytes");
    write_bytes(bytes.substr(0, cut));
    CHECK_THROWS_WITH_AS(decode(bad), doctest::Contains((bad + ": ").c_str()), Error);
  }
}

TEST_CASE("conv1d dumps: weight that contradicts x or kernel_size, unknown activation") {
  test::TempDir dir("bad_conv1d");
  const std::string path = dir.file("bad.h5");
  auto conv_dump = [] {
    io::Dump d;
    d.op = "conv1d";
    d.attrs = {{"format", std::string("kcp-dump")}, {"format_version", int64_t(2)}, {"op", std::string("conv1d")},
               {"activation", std::string("swish")}, {"kernel_size", int64_t(4)}};
    io::DumpGroup& in = d.add_group("inputs");
    in.add("x", io::Array(DType::f32, {1, 10, 3}), DType::f32);
    in.add("weight", io::Array(DType::f32, {3, 4}), DType::f32);
    return d;
  };
  io::dump_write(path, conv_dump());
  CHECK_NOTHROW(decode(path));
  io::Dump d = conv_dump();
  d.attrs["kernel_size"] = int64_t(3);
  io::dump_write(path, d);
  const std::string weight = path + ": /inputs/weight: expected shape [D,W]";
  CHECK_THROWS_WITH_AS(decode(path), doctest::Contains(weight.c_str()), Error);
  d = conv_dump();
  d.attrs["activation"] = std::string("gelu");
  io::dump_write(path, d);
  CHECK_THROWS_WITH_AS(decode(path), doctest::Contains((path + ": attribute activation").c_str()), Error);
}
