// The kcp executable's dump commands, run as a user would (KCP_BIN, set by ctest): check passes a
// golden file, fails a planted wrong result with its location and first mismatches, --write keeps
// the oracle's results; run adds a backend group that check then finds exact; compare and info;
// every bad input gives exit 2, one stderr line naming the file and object, and no output file; a layer
// dump is judged stage by stage and a planted conv error is named as the first departing stage.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "io/dump.h"
#include "validation/cases.h"
#include "tests/io/hostile_files.h"
#include "validation/layer_check.h"
#include "tests/io/io_fixtures.h"

using namespace kcp;

namespace {

struct Run {
  int rc = -1;
  std::string out, err;
};

Run kcp_cli(const std::string& args, const test::TempDir& dir) {
  const char* bin = std::getenv("KCP_BIN");
  REQUIRE_MESSAGE(bin, "KCP_BIN is set by ctest");
  const std::string err_file = dir.file("stderr.txt");
  const std::string cmd = std::string(bin) + " " + args + " 2> " + err_file;
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_file);
  return r;
}

std::string golden(const char* name) {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  REQUIRE(src);
  return std::string(src) + "/data/golden/" + name;
}

int64_t count(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The table rows of one result group.
std::vector<std::string> rows(const std::string& out, const std::string& group) {
  std::vector<std::string> r;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  " + group + " ", 0) == 0) r.push_back(line);
  return r;
}

io::DumpDataset& dataset(io::Dump& d, const char* group, const char* name) {
  for (io::DumpGroup& g : d.groups)
    for (io::DumpDataset& ds : g.datasets)
      if (g.name == group && ds.name == name) return ds;
  FAIL("no dataset ", group, "/", name);
  throw 0;
}

}  // namespace

TEST_CASE("kcp check passes a golden file, one row per (group, tensor)") {
  test::TempDir dir("cli_golden");
  const Run r = kcp_cli("check " + golden("kda_fp32_safe_gate.h5"), dir);
  CHECK(r.rc == 0);
  CHECK(r.err.empty());
  CHECK(count(r.out, " PASS") == 20);  // 10 tensors in each of fla_chunk and fla_naive
  CHECK(count(r.out, "FAIL") == 0);
  CHECK(r.out.find("gate=lower_bound") != std::string::npos);
}

TEST_CASE("a wrong result fails with its location and first mismatches; --write keeps the oracle's results") {
  test::TempDir dir("cli_wrong");
  io::Dump d = io::dump_read(golden("kda_fp32_basic.h5"));
  io::DumpDataset& o = dataset(d, "fla_naive", "o");
  const int64_t flat = ((1 * 128 + 77) * 2 + 1) * 32 + 5;  // element (1,77,1,5) of [2,128,2,32]
  o.data.view().set(flat, o.data.view().get(flat) + 0.5);
  const std::string bad = dir.file("planted.h5"), kept = dir.file("kept.h5");
  io::dump_write(bad, d);
  const Run r = kcp_cli("check --write " + kept + " " + bad, dir);
  CHECK(r.rc == 1);
  CHECK(count(r.out, "FAIL") == 1);
  CHECK(r.out.find("(1,77,1,5)") != std::string::npos);      // max_abs location and the mismatch line
  CHECK(r.out.find("      at (1,77,1,5)") != std::string::npos);
  REQUIRE(std::filesystem::exists(kept));
  const io::Dump k = io::dump_read(kept);
  REQUIRE(k.group("cpu-recurrent"));
  CHECK(k.group("cpu-recurrent")->find("o")->data.dtype == DType::f64);
  const Run again = kcp_cli("check " + kept, dir);  // the oracle's own group passes exactly
  CHECK(again.rc == 1);
  const auto own = rows(again.out, "cpu-recurrent");
  CHECK(own.size() == 8);
  CHECK(std::all_of(own.begin(), own.end(), [](const std::string& l) { return l.find(" PASS") != std::string::npos; }));
}

TEST_CASE("kcp run adds a group named after the backend; check finds it exact; compare and info") {
  test::TempDir dir("cli_run");
  const std::string out = dir.file("run.h5");
  const Run r = kcp_cli("run --backend cpu-recurrent --precision f32 --in " + golden("gdn_fp32_tail.h5") +
                            " --out " + out, dir);
  CHECK(r.rc == 0);
  const io::Dump d = io::dump_read(out);
  CHECK(d.version == io::kDumpVersion);
  REQUIRE(d.group("cpu-recurrent"));
  CHECK(std::get<std::string>(d.group("cpu-recurrent")->attrs.at("compute")) == "float32");
  const Run c = kcp_cli("check " + out, dir);
  CHECK(c.rc == 0);
  CHECK(count(c.out, "PASS") == 24);
  const Run same = kcp_cli("compare " + out + " " + golden("gdn_fp32_tail.h5"), dir);
  CHECK(same.rc == 0);
  CHECK(same.out.find("group only in") != std::string::npos);
  io::Dump other = io::dump_read(golden("gdn_fp32_tail.h5"));
  dataset(other, "inputs", "v").data.view().set(3, 0.0);
  io::dump_write(dir.file("other.h5"), other);
  const Run diff = kcp_cli("compare " + out + " " + dir.file("other.h5"), dir);
  CHECK(diff.rc == 1);
  CHECK(diff.out.find("values differ") != std::string::npos);
  const Run info = kcp_cli("info " + golden("gdn_bf16_varlen.h5"), dir);
  CHECK(info.rc == 0);
  CHECK(info.out.find("/fla_chunk  (results)") != std::string::npos);
  CHECK(info.out.find("dtype bfloat16") != std::string::npos);
  CHECK(info.out.find("problem: gdn(B=1,T=228") != std::string::npos);
}

TEST_CASE("bad input: exit 2, one line naming the file and the object, no output file") {
  test::TempDir dir("cli_bad");
  io::Dump base = io::dump_read(golden("gdn_fp32_tail.h5"));
  struct Bad { std::string name, expect; };
  std::vector<Bad> bad;
  {
    io::Dump d = base;
    for (io::DumpGroup& g : d.groups)
      if (g.name == "inputs") std::erase_if(g.datasets, [](const io::DumpDataset& x) { return x.name == "beta"; });
    io::dump_write(dir.file("missing.h5"), d);
    bad.push_back({"missing.h5", "/inputs/beta: missing"});
    d = base;
    dataset(d, "inputs", "k").data.view().set(11, NAN);
    io::dump_write(dir.file("nan.h5"), d);
    bad.push_back({"nan.h5", "/inputs/k: non-finite value nan at index [0,0,0,11]"});
    d = base;
    d.attrs["op"] = std::string("mamba2");
    io::dump_write(dir.file("op.h5"), d);
    bad.push_back({"op.h5", "attribute op: unknown op"});
    std::ofstream(dir.file("text.h5")) << "not hdf5\n";
    bad.push_back({"text.h5", "not an HDF5 file"});
    std::ifstream in(golden("gdn_fp32_tail.h5"), std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::ofstream(dir.file("cut.h5"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    bad.push_back({"cut.h5", "truncated file"});
  }
  const size_t files_before = dir.count();
  for (const Bad& b : bad) {
    SUBCASE(b.name.c_str()) {
      const std::string f = dir.file(b.name), out = dir.file("out.h5");
      for (const std::string& args : {"check " + f, "check --write " + out + " " + f, "info " + f,
                                      "run --backend cpu-recurrent --in " + f + " --out " + out}) {
        INFO("kcp ", args);
        const Run r = kcp_cli(args, dir);
        CHECK(r.rc == 2);
        CHECK(count(r.err, "\n") == 1);
        CHECK(r.err.find(f + ": ") != std::string::npos);
        CHECK(r.err.find(b.expect) != std::string::npos);
        CHECK(!std::filesystem::exists(out));
        CHECK(dir.count() == files_before);  // no temporary file either
      }
    }
  }
}

TEST_CASE("a folder of good and bad dumps: every good one is checked, exit 2; unknown backends") {
  test::TempDir dir("cli_folder");
  std::filesystem::copy_file(golden("gdn_fp32_tail.h5"), dir.file("a_good.h5"));
  std::ofstream(dir.file("b_bad.h5")) << "garbage";
  const Run r = kcp_cli("check " + dir.path.string(), dir);
  CHECK(r.rc == 2);
  CHECK(count(r.out, "PASS") == 16);
  CHECK(r.err.find("b_bad.h5: not an HDF5 file") != std::string::npos);
  const Run u = kcp_cli("check --backend cuda-nonexistent " + dir.file("a_good.h5"), dir);
  CHECK(u.rc == 2);
  CHECK(u.err.find("unknown backend 'cuda-nonexistent'") != std::string::npos);
  const Run p = kcp_cli("check --precision f16 " + dir.file("a_good.h5"), dir);
  CHECK(p.rc == 2);
  CHECK(p.err.find("--precision") != std::string::npos);
}

TEST_CASE("headwise shards of a golden file check alone; kcp assemble rebuilds the file") {
  test::TempDir dir("cli_shards");
  const io::Dump global = io::dump_read(golden("gdn_fp32_tail.h5"));
  for (int64_t r = 0; r < 2; ++r) io::dump_write(dir.file("shard" + std::to_string(r) + ".h5"),
                                                 test::dump_shard(global, r, 2, false));
  const Run s0 = kcp_cli("check " + dir.file("shard0.h5"), dir);
  CHECK(s0.rc == 0);
  CHECK(count(s0.out, " PASS") == 16);
  CHECK(s0.out.find("cp 0/2 headwise") != std::string::npos);
  const Run a = kcp_cli("assemble --out " + dir.file("g.h5") + " " + dir.file("shard1.h5") + " " +
                            dir.file("shard0.h5"), dir);
  CHECK(a.rc == 0);
  const Run g = kcp_cli("check " + dir.file("g.h5"), dir), ref = kcp_cli("check " + golden("gdn_fp32_tail.h5"), dir);
  CHECK(g.rc == 0);
  for (const char* group : {"fla_chunk", "fla_naive"}) CHECK(rows(g.out, group) == rows(ref.out, group));
}

TEST_CASE("chunkwise shards: results that depend on other ranks are SKIP, the rest is judged") {
  test::TempDir dir("cli_chunkwise");
  val::CaseSpec s;
  s.seqlens = {7, 9}, s.initial_state = s.final_state = false, s.seed = val::seed_from_env(31);
  io::dump_write(dir.file("global.h5"), test::dump_from_case(val::make_case(s)));
  REQUIRE(kcp_cli("run --backend cpu-recurrent --in " + dir.file("global.h5") + " --out " + dir.file("run.h5"),
                  dir).rc == 0);
  const io::Dump run = io::dump_read(dir.file("run.h5"));
  io::dump_write(dir.file("r0.h5"), test::dump_shard(run, 0, 2, true));
  io::dump_write(dir.file("r1.h5"), test::dump_shard(run, 1, 2, true));
  const Run r0 = kcp_cli("check " + dir.file("r0.h5"), dir), r1 = kcp_cli("check " + dir.file("r1.h5"), dir);
  CHECK(r0.rc == 0);
  CHECK(count(r0.out, " PASS") == 1);  // o: rank 0 starts every sequence it holds
  CHECK(count(r0.out, "SKIP") == 5);   // dq dk dv dg dbeta: the second sequence continues on rank 1
  CHECK(r1.rc == 3);  // every tensor skipped: nothing judged (issue 13: non-zero, 3)
  CHECK(count(r1.out, "SKIP") == 6);
  CHECK(r1.out.find("nothing was judged") != std::string::npos);
  CHECK(r1.out.find("depends on other ranks") != std::string::npos);
  REQUIRE(kcp_cli("assemble --out " + dir.file("g.h5") + " " + dir.path.string() + "/r0.h5 " + dir.file("r1.h5"),
                  dir).rc == 0);
  const Run g = kcp_cli("check " + dir.file("g.h5"), dir);
  CHECK(g.rc == 0);
  CHECK(count(g.out, " PASS") == 6);
}

TEST_CASE("hostile dumps through kcp: exit 2, one line naming the file and the object, no output file") {
  test::TempDir dir("cli_hostile");
  const std::vector<test::HostileKind> kinds = test::make_hostile_files(dir.path.string());
  const size_t files_before = dir.count();
  const std::string out = dir.file("out.h5");
  for (const test::HostileKind& k : kinds) {
    for (const std::string& args : {"check " + k.path, "info " + k.path,
                                    "run --backend cpu-recurrent --in " + k.path + " --out " + out}) {
      INFO("kcp ", args);
      const Run r = kcp_cli(args, dir);
      CHECK(r.rc == 2);
      CHECK(count(r.err, "\n") == 1);
      CHECK(r.err.find(k.path + ": " + k.expect) != std::string::npos);
      CHECK(!std::filesystem::exists(out));
      CHECK(dir.count() == files_before);
    }
  }
  const Run m = kcp_cli("--max-memory 1K info " + golden("gdn_fp32_tail.h5"), dir);
  CHECK(m.rc == 2);
  CHECK(m.err.find("over the memory limit of 1.0 KiB") != std::string::npos);
}

TEST_CASE("paths that are not dump files: a directory, a FIFO, a symlink loop, a missing file") {
  test::TempDir dir("cli_paths");
  namespace fs = std::filesystem;
  fs::create_directory(dir.file("folder.h5"));
  REQUIRE(mkfifo(dir.file("fifo.h5").c_str(), 0600) == 0);
  fs::create_symlink(dir.file("loop_b.h5"), dir.file("loop_a.h5"));
  fs::create_symlink(dir.file("loop_a.h5"), dir.file("loop_b.h5"));
  const std::pair<std::string, std::string> cases[] = {
      {"folder.h5", "a directory, expected an HDF5 file"}, {"fifo.h5", "a FIFO (named pipe)"},
      {"loop_a.h5", "a symbolic link loop"}, {"absent.h5", "no such file"}};
  for (const auto& [name, expect] : cases) {
    const Run r = kcp_cli("info " + dir.file(name), dir);
    INFO(name, ": ", r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find(dir.file(name) + ": " + expect) != std::string::npos);
  }
}

TEST_CASE("kcp compare fails on inputs or root attributes that differ or exist on one side only") {
  test::TempDir dir("cli_compare");
  const io::Dump base = io::dump_read(golden("gdn_fp32_tail.h5"));
  io::dump_write(dir.file("a.h5"), base);
  const std::pair<std::string, std::function<void(io::Dump&)>> cases[] = {
      {"attrs   use_qk_l2norm_in_kernel", [](io::Dump& d) { d.attrs["use_qk_l2norm_in_kernel"] = true; }},
      {"attrs   scale", [](io::Dump& d) { d.attrs["scale"] = 0.5; }},
      {"attrs   state_layout", [](io::Dump& d) { d.attrs["state_layout"] = std::string("VK"); }},
      {"inputs  initial_state", [](io::Dump& d) {
         for (io::DumpGroup& g : d.groups)
           if (g.name == "inputs") std::erase_if(g.datasets, [](const io::DumpDataset& x) { return x.name == "initial_state"; });
       }},
  };
  for (const auto& [row, mutate] : cases) {
    io::Dump d = base;
    mutate(d);
    io::dump_write(dir.file("b.h5"), d);
    for (const char* order : {"a.h5 b.h5", "b.h5 a.h5"}) {
      const std::string args = std::string(order);
      const Run r = kcp_cli("compare " + dir.file(args.substr(0, 4)) + " " + dir.file(args.substr(5)), dir);
      INFO(row, " ", order, "\n", r.out);
      CHECK(r.rc == 1);
      CHECK(r.out.find(row.substr(row.find_last_of(' ') + 1)) != std::string::npos);
    }
  }
}

TEST_CASE("kcp check judges a layer dump stage by stage and names the first stage that departs") {
  const test::TempDir dir("cli_layer");
  val::LayerCaseData d = val::make_layer_case(val::named_layer_cases(5).front());
  const auto gr = ref::layer_backward(d.spec.config, d.params, d.in, d.dout, d.dht);
  io::dump_write(dir.file("ok.h5"), val::layer_dump(d, ref::layer_forward(d.spec.config, d.params, d.in), &gr,
                                                    DType::f32, "test"));
  Run r = kcp_cli("check " + dir.file("ok.h5"), dir);
  CHECK(r.rc == 0);
  CHECK(r.out.find("no stage departs") != std::string::npos);
  CHECK(r.out.find("grads/conv1d.weight") != std::string::npos);
  const ref::LayerHook<double> plant = [](const std::string& stage, Tensor<double>& t) {
    if (stage == "qkv_conv") t.vec()[3] += 0.5;  // one wrong element in the conv output
  };
  io::dump_write(dir.file("conv.h5"), val::layer_dump(d, ref::layer_forward(d.spec.config, d.params, d.in, plant),
                                                      nullptr, DType::f32, "test"));
  r = kcp_cli("check " + dir.file("conv.h5"), dir);
  CHECK(r.rc == 1);
  CHECK(r.out.find("first departure: stage 'conv' (tensor qkv_conv)") != std::string::npos);
  r = kcp_cli("info " + dir.file("ok.h5"), dir);  // info describes the layer; run needs /inputs
  CHECK(r.rc == 0);
  CHECK(r.out.find("layer: kda-layer(") != std::string::npos);
  r = kcp_cli("run --backend cpu-recurrent --in " + dir.file("ok.h5") + " --out " + dir.file("run.h5"), dir);
  CHECK(r.rc == 2);
  CHECK(r.err.find("/inputs: missing (a layer capture") != std::string::npos);
}

TEST_CASE("a file that crashes libhdf5: one line, exit 2, and the next file is still checked") {
  test::TempDir dir("cli_crash");
  const char* src = std::getenv("KCP_SOURCE_DIR");
  REQUIRE(src);
  std::filesystem::copy_file(std::string(src) + "/tests/fuzz/regressions/hdf5_segv_root_attr_op.h5",
                             dir.file("a_crash.h5"));
  std::filesystem::copy_file(golden("gdn_fp32_tail.h5"), dir.file("b_good.h5"));
  const Run r = kcp_cli("check " + dir.path.string(), dir);
  CHECK(r.rc == 2);
  CHECK(count(r.out, "PASS") == 16);
#ifndef __SANITIZE_ADDRESS__  // a sanitizer may print its own report of the contained crash
  CHECK(count(r.err, "\n") == 1);
#endif
  // SIGSEGV, or "exit status 1" under AddressSanitizer (its SEGV handler exits instead of dying)
  CHECK(r.err.find(dir.file("a_crash.h5") + ": corrupt HDF5 file (") != std::string::npos);
  CHECK(r.err.find(" in the HDF5 library reading / attribute op)") != std::string::npos);
  const Run i = kcp_cli("info " + dir.file("a_crash.h5"), dir);
  CHECK(i.rc == 2);
  CHECK(i.err.rfind("kcp info: error: " + dir.file("a_crash.h5") + ": corrupt HDF5 file (", 0) == 0);
}
