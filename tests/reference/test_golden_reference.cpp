// The float64 oracle against FLA (data/golden, produced by FLA on an H100): for every gdn, kda
// and gla file (16 files in data/golden with conv1d's), the oracle run on the file's inputs reproduces fla_naive (FLA's float32 token recurrence)
// to fla_ratio < 1e-5 for tensors stored as float32 and < 3e-3 where FLA rounded to bfloat16, and
// lands on fla_chunk within FLA's own thresholds (o, final_state 0.005; dq, dk, dv, dh0 0.008;
// dg, dbeta 0.02). The bars are issue #2's, stated here directly rather than through the policy
// table of `kcp check` (tests/validation covers that path), so the two checks stay independent.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "io/dump.h"
#include "io/dump_call.h"
#include "reference/backend_cpu.h"
#include "validation/compare.h"
#include "validation/dump_runner.h"
#include "validation/tolerance.h"

using namespace kcp;

namespace {

std::string golden_dir() {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  return std::string(src ? src : ".") + "/data/golden";
}

// FLA's thresholds for its chunk kernels; for kda's fused-gate parameters FLA uses 0.008 (ddt_bias)
// and warns at 0.003 (dA_log): we hold the oracle to the warning level as a hard bar.
double chunk_bar(const std::string& op, const std::string& name) {
  if (name == "o" || name == "final_state") return val::tol::kFlaChunkOutput;
  if (op == "kda" && name == "ddt_bias") return val::tol::kFlaChunkKdaDtBias;
  if (op == "kda" && name == "dA_log") return val::tol::kFlaChunkKdaALogWarn;
  if (name == "dg" || name == "dbeta" || name == "dA_log" || name == "ddt_bias") return val::tol::kFlaChunkGateBeta;
  return val::tol::kFlaChunkGrad;
}

}  // namespace

TEST_CASE("float64 oracle reproduces FLA's goldens") {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(golden_dir()))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 16);  // data/golden equals the project's golden set (data/README.md)
  int judged = 0;
  for (const std::string& f : files) {
    const io::Dump d = io::dump_read(f);
    if (d.op == "conv1d") continue;  // conv1d is judged by the golden label through kcp check
    SUBCASE(std::filesystem::path(f).filename().string().c_str()) {
      const io::OpCall call = io::dump_op_call(d, DType::f64);
      auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
      const val::Results ours = val::run_op_call(*oracle, call);
      for (const char* group : {"fla_naive", "fla_chunk"}) {
        const io::DumpGroup* g = d.group(group);
        REQUIRE(g != nullptr);
        for (const io::DumpDataset& ds : g->datasets) {
          const auto it = ours.find(ds.name);
          INFO(f, " /", group, "/", ds.name);
          REQUIRE(it != ours.end());
          const val::Metrics m = val::compare(it->second.view(), ds.data.view());
          const double bar = std::string(group) == "fla_naive"
                                 ? (ds.source == DType::bf16 ? val::tol::kGoldenNaiveBf16 : val::tol::kGoldenNaiveF32)
                                 : chunk_bar(d.op, ds.name);
          INFO("fla_ratio ", m.fla_ratio, " bar ", bar);
          CHECK(m.finite_ok());
          CHECK(m.fla_ratio < bar);
          ++judged;
        }
      }
    }
  }
  CHECK(judged > 0);
}
