// The HDF5 layer: every dtype and bf16 encoding round-trips bit for bit (all 65536 bf16/f16 patterns),
// bf16 written by other tools (h5py's 2-byte float, Keras' opaque, uint16 bits, float32 + attribute)
// reads the same, HDF5's own narrowing would round differently (why kcp narrows itself), and
// attributes of every kind h5py writes read back as what they mean.
#include <doctest/doctest.h>

#include <cstring>

#include "core/rng.h"
#include "io/h5.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

using namespace kcp;
using io::H5Id;

namespace {

// An array of `t` whose bytes are seeded random bits (for 16-bit types: every pattern, in order).
io::Array pattern_array(DType t, uint64_t seed) {
  const bool all16 = dtype_size(t) == 2;
  io::Array a(t, all16 ? Shape{256, 256} : Shape{7, 33});
  auto* bytes = static_cast<unsigned char*>(a.data());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (all16) {
      const uint16_t v = uint16_t(i);
      std::memcpy(bytes + 2 * i, &v, 2);
    } else {
      const uint64_t v = CounterRng{seed, uint64_t(t)}.bits(uint64_t(i));
      std::memcpy(bytes + i * dtype_size(t), &v, size_t(dtype_size(t)));
    }
  }
  return a;
}

void write_one(const std::string& path, const io::Array& a, DType source, io::Encoding e) {
  H5Id f = io::file_create(path);
  io::dataset_write(f.get(), "x", a, source, e, {}, path + ": /x");
}

io::StoredArray read_one(const std::string& path) {
  H5Id f = io::file_open_read(path);
  return io::dataset_read(f.get(), "x", path + ": /x");
}

// Writes a dataset with the raw C API, as another tool would.
void raw_dataset(hid_t file, const char* name, hid_t ftype, hid_t mtype, const Shape& shape, const void* data,
                 const char* dtype_label) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Id sp(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id ds(H5Dcreate2(file, name, ftype, sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  REQUIRE(H5Dwrite(ds.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
  if (dtype_label) io::attrs_write(ds.get(), {{"dtype", std::string(dtype_label)}}, name);
}

bool same_bytes(const io::Array& a, const io::Array& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("every dtype and bf16 encoding round-trips bit-identically") {
  const uint64_t seed = val::seed_from_env(1);
  test::TempDir dir("h5_roundtrip");
  struct Form { DType t; io::Encoding e; };
  for (Form f : {Form{DType::f64, io::Encoding::ieee}, Form{DType::f32, io::Encoding::ieee},
                 Form{DType::f16, io::Encoding::ieee}, Form{DType::bf16, io::Encoding::bf16_float},
                 Form{DType::bf16, io::Encoding::bf16_bits}, Form{DType::i32, io::Encoding::ieee},
                 Form{DType::i64, io::Encoding::ieee}}) {
    const std::string name = std::string(dtype_name(f.t)) + "/" + std::string(io::encoding_name(f.e));
    SUBCASE(name.c_str()) {
      const io::Array a = pattern_array(f.t, seed);
      write_one(dir.file("x.h5"), a, f.t, f.e);
      const io::StoredArray r = read_one(dir.file("x.h5"));
      CHECK(same_bytes(r.data, a));
      CHECK(r.source == f.t);
      CHECK(r.encoding == f.e);
    }
  }
  SUBCASE("bfloat16/ieee (float32 holding bf16 values)") {
    io::Array a = pattern_array(DType::bf16, seed);
    auto* p = static_cast<uint16_t*>(a.data());
    for (int64_t i = 0; i < a.numel(); ++i)  // NaN payloads cannot survive float32 -> bf16 narrowing
      if ((p[i] & 0x7f80u) == 0x7f80u && (p[i] & 0x7fu)) p[i] = 0x7fc0u;
    write_one(dir.file("x.h5"), a, DType::bf16, io::Encoding::ieee);
    const io::StoredArray r = read_one(dir.file("x.h5"));
    CHECK(r.data.dtype == DType::f32);
    CHECK(r.source == DType::bf16);
    CHECK(same_bytes(io::array_convert(r.data, DType::bf16), a));
  }
}

TEST_CASE("bfloat16 as other tools write it reads as the same values") {
  test::TempDir dir("h5_bf16_forms");
  const std::string path = dir.file("forms.h5");
  const io::Array ref = pattern_array(DType::bf16, 0);
  io::Array wide = io::array_convert(ref, DType::f32);
  {
    H5Id f = io::file_create(path);
    // h5py's form, docs/DUMP_FORMAT.md section 3 "bf16_float": IEEE f32 copied, fields set, size 2, bias 127
    H5Id t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    H5Tset_fields(t.get(), 15, 7, 8, 0, 7);
    H5Tset_size(t.get(), 2);
    H5Tset_ebias(t.get(), 127);
    CHECK(H5Tequal(t.get(), io::bf16_float_type().get()) > 0);
    raw_dataset(f.get(), "float_type", t.get(), t.get(), ref.shape, ref.data(), nullptr);
    // Keras / ml_dtypes: a 2-byte opaque type plus attribute dtype
    H5Id op(H5Tcreate(H5T_OPAQUE, 2), H5Tclose);
    H5Tset_tag(op.get(), "|V2");
    raw_dataset(f.get(), "opaque", op.get(), op.get(), ref.shape, ref.data(), "bfloat16");
    // h5py#1822 workaround: uint16 bits plus attribute
    raw_dataset(f.get(), "uint16", H5T_STD_U16LE, H5T_NATIVE_UINT16, ref.shape, ref.data(), "bfloat16");
    // our goldens: float32 plus attribute
    raw_dataset(f.get(), "float32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, wide.shape, wide.data(), "bfloat16");
  }
  H5Id f = io::file_open_read(path);
  for (const char* name : {"float_type", "opaque", "uint16"}) {
    const io::StoredArray r = io::dataset_read(f.get(), name, name);
    INFO(name);
    CHECK(r.source == DType::bf16);
    CHECK(same_bytes(r.data, ref));
  }
  const io::StoredArray g = io::dataset_read(f.get(), "float32", "float32");
  CHECK(g.source == DType::bf16);
  CHECK(same_bytes(g.data, wide));
}

TEST_CASE("HDF5's float32 -> bf16 conversion rounds ties away from zero; kcp rounds to even") {
  // 0x3F808000 lies halfway between bf16 0x3F80 and 0x3F81 (docs/DUMP_FORMAT.md section 3).
  const uint32_t tie_bits = 0x3F808000u;
  float tie;
  std::memcpy(&tie, &tie_bits, 4);
  CHECK(float_to_bf16(tie) == 0x3F80u);
  uint16_t hdf5_bits = 0;
  float buf = tie;
  H5Id bf = io::bf16_float_type();
  REQUIRE(H5Tconvert(H5T_NATIVE_FLOAT, bf.get(), 1, &buf, nullptr, H5P_DEFAULT) >= 0);
  std::memcpy(&hdf5_bits, &buf, 2);
  CHECK(hdf5_bits == 0x3F81u);  // why dataset_write never lets HDF5 narrow
  io::Array a(DType::f32, {1});
  *static_cast<float*>(a.data()) = tie;
  test::TempDir dir("h5_rne");
  write_one(dir.file("x.h5"), io::array_convert(a, DType::bf16), DType::bf16, io::Encoding::bf16_float);
  CHECK(*static_cast<const uint16_t*>(read_one(dir.file("x.h5")).data.data()) == 0x3F80u);
}

TEST_CASE("a 2-byte float with exponent bias 15 is refused as bfloat16 (the h5py#1822 trap)") {
  test::TempDir dir("h5_bias15");
  const std::string path = dir.file("bad.h5");
  {
    H5Id f = io::file_create(path);
    H5Id t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    H5Tset_fields(t.get(), 15, 7, 8, 0, 7);
    H5Tset_size(t.get(), 2);
    H5Tset_ebias(t.get(), 15);
    const uint16_t v[2] = {0x3F80u, 0x4000u};
    raw_dataset(f.get(), "x", t.get(), t.get(), {2}, v, "bfloat16");
  }
  CHECK_THROWS_WITH_AS(read_one(path), doctest::Contains("bias 15"), Error);
  CHECK_THROWS_WITH_AS(read_one(path), doctest::Contains((path + ": /x").c_str()), Error);
}

TEST_CASE("attributes: strings of both kinds, h5py booleans, uint8 flags, numbers, arrays") {
  test::TempDir dir("h5_attrs");
  const std::string path = dir.file("a.h5");
  {
    H5Id f = io::file_create(path);
    io::attrs_write(f.get(), {{"vstr", std::string("kda")}, {"flag", true}, {"off", false}, {"n", int64_t(-3)},
                              {"x", 0.25}, {"ints", std::vector<int64_t>{1, 2, 3}},
                              {"reals", std::vector<double>{0.5}}},
                    path);
    H5Id sp(H5Screate(H5S_SCALAR), H5Sclose);
    for (auto [name, pad] : {std::pair{"fixed_null", H5T_STR_NULLTERM}, std::pair{"fixed_space", H5T_STR_SPACEPAD}}) {
      H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);  // np.bytes_ in h5py: a fixed-length string
      H5Tset_size(t.get(), 8);
      H5Tset_strpad(t.get(), pad);
      const char text[8] = {'g', 'd', 'n', pad == H5T_STR_SPACEPAD ? ' ' : '\0', ' ', ' ', ' ', ' '};
      H5Id a(H5Acreate2(f.get(), name, t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      REQUIRE(H5Awrite(a.get(), t.get(), text) >= 0);
    }
    const uint8_t one = 1, two = 2;
    for (auto [name, v] : {std::pair{"u8_flag", &one}, std::pair{"u8_two", &two}}) {
      H5Id a(H5Acreate2(f.get(), name, H5T_STD_U8LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      REQUIRE(H5Awrite(a.get(), H5T_NATIVE_UINT8, v) >= 0);
    }
    // a bool as h5py writes it must be an enum over int8 with members FALSE/TRUE
    H5Id a(H5Aopen(f.get(), "flag", H5P_DEFAULT), H5Aclose);
    H5Id t(H5Aget_type(a.get()), H5Tclose);
    CHECK(H5Tget_class(t.get()) == H5T_ENUM);
    CHECK(H5Tget_size(t.get()) == 1);
  }
  H5Id f = io::file_open_read(path);
  const io::Attributes at = io::attrs_read(f.get(), path);
  CHECK(std::get<std::string>(at.at("vstr")) == "kda");
  CHECK(std::get<std::string>(at.at("fixed_null")) == "gdn");
  CHECK(std::get<std::string>(at.at("fixed_space")) == "gdn");
  CHECK(std::get<bool>(at.at("flag")) == true);
  CHECK(std::get<bool>(at.at("off")) == false);
  CHECK(std::get<int64_t>(at.at("n")) == -3);
  CHECK(std::get<double>(at.at("x")) == 0.25);
  CHECK(std::get<std::vector<int64_t>>(at.at("ints")) == std::vector<int64_t>{1, 2, 3});
  CHECK(std::get<double>(at.at("reals")) == 0.5);  // a 1-element array reads as a scalar
  CHECK(io::attr_flag(at, "u8_flag", path, false) == true);
  CHECK(io::attr_flag(at, "flag", path, false) == true);
  CHECK(io::attr_flag(at, "absent", path, true) == true);
  CHECK_THROWS_WITH_AS(io::attr_flag(at, "u8_two", path, false), doctest::Contains("attribute u8_two"), Error);
  CHECK_THROWS_WITH_AS(io::attr_flag(at, "vstr", path, false), doctest::Contains("the string 'kda'"), Error);
  CHECK_THROWS_WITH_AS(io::attr_flag(at, "x", path, false), doctest::Contains("expected a boolean"), Error);
  CHECK_THROWS_WITH_AS(io::attr_int(at, "x", path, 0), doctest::Contains("expected an integer"), Error);
  CHECK(io::attr_number(at, "n", path, 0) == -3.0);
}

TEST_CASE("missing objects and non-HDF5 files are errors that name the file and the object") {
  test::TempDir dir("h5_missing");
  const std::string path = dir.file("x.h5");
  write_one(path, pattern_array(DType::f32, 0), DType::f32, io::Encoding::ieee);
  H5Id f = io::file_open_read(path);
  const std::string where = path + ": /nope";
  CHECK_THROWS_WITH_AS(io::dataset_read(f.get(), "nope", where), doctest::Contains(where.c_str()), Error);
  CHECK_THROWS_WITH_AS(io::group_open(f.get(), "g", path + ": /g"), doctest::Contains("cannot open the group"), Error);
  CHECK_THROWS_WITH_AS(io::file_open_read(dir.file("absent.h5")), doctest::Contains("no such file"), Error);
}
