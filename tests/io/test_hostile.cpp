// Hostile dumps (tests/io/hostile_files.h): each is refused with one kcp::Error naming the file and
// the object, before any large allocation and without reading other files; the memory limit and the
// overflow-checked size helpers (io/limits.h). Also runs under ASan/UBSan as test_io_asan.
#include <doctest/doctest.h>

#include "io/dump_call.h"
#include "io/limits.h"
#include "tests/io/hostile_files.h"
#include "tests/io/io_fixtures.h"

using namespace kcp;

namespace {

void decode(const std::string& path) {
  const io::Dump d = io::dump_read(path);
  if (d.op == "conv1d") io::dump_conv1d_call(d);
  else io::dump_op_call(d, DType::f64);
}

}  // namespace

TEST_CASE("every hostile kind is one error naming the file and the object") {
  test::TempDir dir("hostile");
  const std::vector<test::HostileKind> kinds = test::make_hostile_files(dir.path.string());
  CHECK(kinds.size() >= 15);
  for (const test::HostileKind& k : kinds) {
    INFO("kind ", k.name);
    CHECK_THROWS_WITH_AS(decode(k.path), doctest::Contains((k.path + ": " + k.expect).c_str()), Error);
  }
  SUBCASE("the good dump they start from decodes") {
    test::write_good_dump(dir.file("good.h5"));
    CHECK_NOTHROW(decode(dir.file("good.h5")));
  }
}

TEST_CASE("sizes: overflow-checked products, byte strings, the memory limit") {
  CHECK(io::checked_mul(1 << 20, 1 << 20, "x") == int64_t(1) << 40);
  CHECK_THROWS_WITH_AS(io::checked_mul(int64_t(1) << 40, int64_t(1) << 30, "x.h5: state"),
                       doctest::Contains("x.h5: state: size overflows 63 bits"), Error);
  CHECK_THROWS_AS(io::checked_bytes({int64_t(1) << 21, 1, int64_t(1) << 20, int64_t(1) << 20}, 8, "s"), Error);
  CHECK(io::parse_bytes("8G", "--max-memory") == int64_t(8) << 30);
  CHECK(io::parse_bytes("512M", "--max-memory") == int64_t(512) << 20);
  CHECK_THROWS_WITH_AS(io::parse_bytes("lots", "--max-memory"), doctest::Contains("--max-memory: expected a size"),
                       Error);
  test::TempDir dir("limit");
  const std::string path = dir.file("good.h5");
  test::write_good_dump(path);
  io::set_memory_limit(1024);  // the good dump's inputs alone are larger
  CHECK_THROWS_WITH_AS(decode(path), doctest::Contains("over the memory limit of 1.0 KiB"), Error);
  io::set_memory_limit(0);
  CHECK_NOTHROW(decode(path));
}
