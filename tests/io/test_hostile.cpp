// Hostile dumps (tests/io/hostile_files.h): each is refused with one kcp::Error naming the file and
// the object, before any large allocation and without reading other files; the memory limit and the
// overflow-checked size helpers (io/limits.h). Also runs under ASan/UBSan as test_io_asan.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <random>

#include "io/dump_call.h"
#include "io/limits.h"
#include "tests/io/hostile_files.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

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

namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put_bytes(const std::string& path, const std::string& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), std::streamsize(b.size()));
}

// Everything a decode depends on, as bytes: dataset names, shapes, dtypes, data, attributes.
std::string fingerprint(const io::Dump& d) {
  std::string s;
  for (const auto& [k, v] : d.attrs) s += k + "=" + io::attr_describe(v) + ";";
  for (const io::DumpGroup& g : d.groups) {
    s += "/" + g.name + ":";
    for (const auto& [k, v] : g.attrs) s += k + "=" + io::attr_describe(v) + ";";
    for (const io::DumpDataset& ds : g.datasets) {
      s += ds.name + shape_str(ds.data.shape) + std::string(dtype_name(ds.data.dtype));
      for (const auto& [k, v] : ds.attrs) s += k + "=" + io::attr_describe(v) + ";";
      s.append(static_cast<const char*>(ds.data.data()), ds.data.nbytes());
    }
  }
  return s;
}

}  // namespace

TEST_CASE("dumps kcp writes carry checksums: a flipped bit is an error, never different numbers") {
  test::TempDir dir("checksum");
  const std::string good = dir.file("good.h5"), bad = dir.file("flipped.h5");
  test::write_good_dump(good);
  const std::string bytes = file_bytes(good), expect = fingerprint(io::dump_read(good));
  {  // q's data: Fletcher32 on its chunk
    io::H5Id f(H5Fopen(good.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    io::H5Id ds(H5Dopen2(f.get(), "inputs/q", H5P_DEFAULT), H5Dclose);
    io::H5Id dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
    REQUIRE(H5Pget_nfilters(dcpl.get()) == 1);
    unsigned flags = 0, fmask = 0;
    size_t nelmts = 0;
    CHECK(H5Pget_filter2(dcpl.get(), 0, &flags, &nelmts, nullptr, 0, nullptr, &fmask) == H5Z_FILTER_FLETCHER32);
    haddr_t addr = 0;
    hsize_t size = 0, offset[4] = {};
    io::H5Id space(H5Dget_space(ds.get()), H5Sclose);
    REQUIRE(H5Dget_chunk_info(ds.get(), space.get(), 0, offset, &fmask, &addr, &size) >= 0);
    const uint64_t seed = val::seed_from_env(17);
    INFO("seed ", seed);
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 64; ++i) {
      std::string b = bytes;
      const size_t at = size_t(addr) + size_t(rng() % size);
      b[at] = char(b[at] ^ (1 << (rng() % 8)));
      put_bytes(bad, b);
      INFO("bit flip at byte ", at);
      CHECK_THROWS_WITH_AS(io::dump_read(bad), doctest::Contains((bad + ": /inputs/q: corrupt: a checksum").c_str()), Error);
    }
  }
  const uint64_t seed = val::seed_from_env(19);
  INFO("seed ", seed);
  std::mt19937_64 rng(seed);
  // Each read in a child: libhdf5 1.10 itself can crash on some damaged metadata, which the kcp
  // programs contain with their own child process (app/isolate.h); here a signal counts as refused.
  int rejected = 0, crashed = 0;
  for (int i = 0; i < 240; ++i) {  // anywhere in the file: refused, or read back unchanged
    std::string b = bytes;
    const size_t at = rng() % b.size();
    b[at] = char(b[at] ^ (1 << (rng() % 8)));
    put_bytes(bad, b);
    INFO("bit flip at byte ", at, " of ", b.size());
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL), signal(SIGBUS, SIG_DFL), signal(SIGABRT, SIG_DFL), signal(SIGFPE, SIG_DFL);
      try {
        _exit(fingerprint(io::dump_read(bad)) == expect ? 0 : 3);
      } catch (const Error& e) {
        _exit(std::string(e.what()).rfind(bad + ": ", 0) == 0 ? 1 : 4);
      }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
      ++crashed;
      continue;
    }
    const int code = WEXITSTATUS(status);
    CHECK_MESSAGE(code != 3, "read back different values");
    CHECK_MESSAGE(code != 4, "an error that does not name the file");
    rejected += code == 1;
  }
  MESSAGE(rejected, " of 240 single-bit flips refused with an error, ", crashed, " crashed libhdf5 (contained by "
          "app/isolate.h in the kcp programs), the rest read back unchanged");
}

TEST_CASE("SIGTERM or SIGINT during dump_write removes the temporary file") {
  for (int sig : {SIGTERM, SIGINT}) {
    test::TempDir dir("temp_signal");
    const std::string target = dir.file("big.h5");
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);  // not doctest's handlers: die as kcp would
      io::Dump d;
      d.op = "gdn";
      d.attrs = {{"op", std::string("gdn")}};
      io::DumpGroup& g = d.add_group("inputs");
      for (int i = 0; i < 8; ++i) g.add("x" + std::to_string(i), io::Array(DType::f64, {1 << 22}), DType::f64);
      io::dump_write(target, d);  // 256 MiB: long enough to be interrupted
      _exit(0);
    }
    bool seen = false;
    for (int i = 0; i < 20000 && !seen; ++i) {
      for (const auto& e : std::filesystem::directory_iterator(dir.path))
        seen = seen || e.path().filename().string().find(".tmp-") != std::string::npos;
      if (!seen) usleep(200);
    }
    CHECK(seen);
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    INFO("signal ", sig);
    CHECK(WIFSIGNALED(status));
    std::string left;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) left += e.path().filename().string() + " ";
    CHECK_MESSAGE(dir.count() == 0, "left: ", left);  // neither the target nor the temporary file
  }
}
