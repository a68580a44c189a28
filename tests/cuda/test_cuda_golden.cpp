// The accuracy bar on FLA's golden dumps (data/golden): for every gdn / kda file and each
// forward output (o, final_state), the error of cuda-chunkwise against the float64 oracle
// (cpu-recurrent on the file's inputs) is no larger than the error of FLA's own chunk kernels
// (/fla_chunk) against the same oracle, measured by FLA's err_ratio (fla_ratio). q, k, v go to the
// device in the file's input dtype and o is written in it, as in FLA's run; gates, beta, states in
// float32. The bar comes from the file itself, case by case.
// Each file prints both errors. Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cuda/backend_cuda.h"
#include "io/dump.h"
#include "io/dump_call.h"
#include "reference/backend_cpu.h"
#include "tests/cuda/cuda_support.h"
#include "validation/compare.h"

using namespace kcp;

namespace {

std::vector<std::string> golden_files() {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  const std::string dir = std::string(src ? src : ".") + "/data/golden";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// A host input on the device in dtype `dt` (the goldens store bf16 values as float32: converting
// them back is exact, and runs the kernels' 16-bit path as FLA's run did).
TensorView stage(Backend& gpu, std::vector<test::DeviceTensor>& keep, const TensorView& host, DType dt) {
  if (host.empty()) return {};
  keep.push_back(test::to_device(gpu, to_tensor<double>(host), dt));
  return keep.back().view;
}

}  // namespace

TEST_CASE("cuda-chunkwise forward is at least as accurate as FLA on every golden file" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  const std::vector<std::string> files = golden_files();
  REQUIRE(!files.empty());
  std::printf("| file | output | FLA fla_chunk err | cuda-chunkwise err |\n|---|---|---|---|\n");
  int judged = 0;
  for (const std::string& f : files) {
    const io::Dump d = io::dump_read(f);
    if (d.op != "gdn" && d.op != "kda" && d.op != "gla") continue;
    const std::string file = std::filesystem::path(f).filename().string();
    SUBCASE(file.c_str()) {
      const io::OpCall call = io::dump_op_call(d, DType::f64);
      auto ref = val::make_outputs<double>(call.problem, true);
      oracle->forward(call.problem, call.inputs, ref.views());
      Problem p = call.problem;
      p.compute = DType::f32;
      REQUIRE(gpu->supports(p));
      std::vector<test::DeviceTensor> keep;
      const Inputs& h = call.inputs;
      const DType in_dt = call.input_dtype, f32 = DType::f32;
      const Inputs in{stage(*gpu, keep, h.q, in_dt), stage(*gpu, keep, h.k, in_dt), stage(*gpu, keep, h.v, in_dt),
                      stage(*gpu, keep, h.g, f32), stage(*gpu, keep, h.beta, f32), stage(*gpu, keep, h.A_log, f32),
                      stage(*gpu, keep, h.dt_bias, f32), stage(*gpu, keep, h.initial_state, f32)};
      test::DeviceTensor o = test::poisoned(*gpu, call.input_dtype, shape_v(p));
      test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
      gpu->forward(p, in, {o.view, ht.view});
      const io::DumpGroup* fla = d.group("fla_chunk");
      REQUIRE(fla != nullptr);
      for (const char* name : {"o", "final_state"}) {
        const io::DumpDataset* ds = fla->find(name);
        if (!ds) continue;
        const Tensor<double>& r = std::string(name) == "o" ? ref.o : ref.final_state;
        const Tensor<double> ours = test::to_host(*gpu, std::string(name) == "o" ? o.view : ht.view);
        const double e_fla = val::compare(ds->data.view(), r.view()).fla_ratio;
        const val::Metrics m = val::compare(ours.view(), r.view());
        std::printf("| %s | %s | %.3e | %.3e |\n", file.c_str(), name, e_fla, m.fla_ratio);
        INFO(file, " ", name, ": cuda-chunkwise ", m.fla_ratio, " vs FLA ", e_fla);
        CHECK(m.nan_a == 0);
        CHECK(m.fla_ratio <= e_fla);
        ++judged;
      }
    }
  }
  CHECK(judged > 0);
}
