// The accuracy bar on FLA's golden dumps (data/golden): for every gdn / kda / gla file and each
// forward output (o, final_state), the error of cuda-chunkwise against the float64 oracle
// (cpu-recurrent on the file's inputs) is no larger than the error of FLA's own chunk kernels
// (/fla_chunk) against the same oracle, measured by FLA's err_ratio (fla_ratio). q, k, v go to the
// device in the file's input dtype and o is written in it, as in FLA's run; gates, beta, states in
// float32. The bar comes from the file itself, case by case.
// The same bar for the gradients of every gdn / kda / gla file (issues 11 and 16: dq, dk, dv, dg,
// dbeta, dinitial_state, dA_log, ddt_bias where FLA's run has them, tensor by tensor), each written
// in the dtype FLA returned it in (the dataset's source dtype), do in the input dtype: 16-bit files
// run the backward's 16-bit path (one TF32 product per operand pair, chunk_bwd.cuh).
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
#include "validation/dump_runner.h"

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

struct StagedInputs {
  std::vector<test::DeviceTensor> keep;
  Inputs in;
};
StagedInputs stage_inputs(Backend& gpu, const io::OpCall& call) {
  StagedInputs s;
  s.keep.reserve(8);
  const Inputs& h = call.inputs;
  const DType in_dt = call.input_dtype, f32 = DType::f32;
  s.in = Inputs{stage(gpu, s.keep, h.q, in_dt),       stage(gpu, s.keep, h.k, in_dt),     stage(gpu, s.keep, h.v, in_dt),
                stage(gpu, s.keep, h.g, f32),         stage(gpu, s.keep, h.beta, f32),    stage(gpu, s.keep, h.A_log, f32),
                stage(gpu, s.keep, h.dt_bias, f32),   stage(gpu, s.keep, h.initial_state, f32)};
  return s;
}

// One tensor: cuda-chunkwise's fla_ratio against the oracle no larger than FLA's (printed as a row).
void judge(const std::string& file, const std::string& name, const TensorView& fla, const Tensor<double>& ours,
           const TensorView& ref) {
  const double e_fla = val::compare(fla, ref).fla_ratio;
  const val::Metrics m = val::compare(ours.view(), ref);
  std::printf("| %s | %s | %.3e | %.3e |\n", file.c_str(), name.c_str(), e_fla, m.fla_ratio);
  INFO(file, " ", name, ": cuda-chunkwise ", m.fla_ratio, " vs FLA ", e_fla);
  CHECK(m.nan_a == 0);
  CHECK(m.fla_ratio <= e_fla);
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
      StagedInputs st = stage_inputs(*gpu, call);
      test::DeviceTensor o = test::poisoned(*gpu, call.input_dtype, shape_v(p));
      test::DeviceTensor ht = test::poisoned(*gpu, DType::f32, shape_state(p));
      gpu->forward(p, st.in, {o.view, ht.view});
      const io::DumpGroup* fla = d.group("fla_chunk");
      REQUIRE(fla != nullptr);
      for (const char* name : {"o", "final_state"}) {
        const io::DumpDataset* ds = fla->find(name);
        if (!ds) continue;
        const Tensor<double>& r = std::string(name) == "o" ? ref.o : ref.final_state;
        const Tensor<double> ours = test::to_host(*gpu, std::string(name) == "o" ? o.view : ht.view);
        judge(file, name, ds->data.view(), ours, r.view());
        ++judged;
      }
    }
  }
  CHECK(judged > 0);
}

TEST_CASE("cuda-chunkwise backward is at least as accurate as FLA on every golden file" *
          doctest::skip(!test::gpu_present())) {
  auto gpu = cuda::make_cuda_backend();
  auto oracle = ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  std::printf("| file | gradient | FLA fla_chunk err | cuda-chunkwise err |\n|---|---|---|---|\n");
  int judged = 0;
  for (const std::string& f : golden_files()) {
    const io::Dump d = io::dump_read(f);
    if (d.op != "gdn" && d.op != "kda" && d.op != "gla") continue;
    const std::string file = std::filesystem::path(f).filename().string();
    SUBCASE(file.c_str()) {
      const io::OpCall call = io::dump_op_call(d, DType::f64);
      REQUIRE(!call.cotangents.d_o.empty());
      const val::Results ref = val::run_op_call(*oracle, call);  // o, final_state and the gradients, float64
      Problem p = call.problem;
      p.compute = DType::f32;
      REQUIRE(gpu->supports_backward(p));
      StagedInputs st = stage_inputs(*gpu, call);
      std::vector<test::DeviceTensor> cot;
      const Cotangents dc{stage(*gpu, cot, call.cotangents.d_o, call.input_dtype),
                          stage(*gpu, cot, call.cotangents.d_final_state, DType::f32)};
      const io::DumpGroup* fla = d.group("fla_chunk");
      REQUIRE(fla != nullptr);
      std::vector<std::pair<std::string, test::DeviceTensor>> out;
      out.reserve(8);
      Grads gr;
      auto put = [&](const char* name, const Shape& shape, TensorView& v, bool wanted) {
        if (!wanted) return;
        const io::DumpDataset* ds = fla->find(name);
        INFO(file, ": ", name);
        REQUIRE(ds != nullptr);  // every gradient the call has is judged
        out.emplace_back(name, test::poisoned(*gpu, ds->source, shape));
        v = out.back().second.view;
      };
      put("dq", shape_qk(p), gr.dq, true), put("dk", shape_qk(p), gr.dk, true), put("dv", shape_v(p), gr.dv, true);
      put("dg", shape_g(p), gr.dg, true), put("dbeta", shape_beta(p), gr.dbeta, p.delta_rule());
      put("dinitial_state", shape_state(p), gr.d_initial_state, !st.in.initial_state.empty());
      put("dA_log", {p.HV}, gr.dA_log, !st.in.A_log.empty());
      put("ddt_bias", shape_dt_bias(p), gr.ddt_bias, !st.in.dt_bias.empty());
      gpu->backward(p, st.in, dc, gr);
      for (auto& [name, t] : out) {
        INFO(file, ": ", name);
        REQUIRE(ref.count(name) == 1);
        judge(file, name, fla->find(name)->data.view(), test::to_host(*gpu, t.view), ref.at(name).view());
        ++judged;
      }
    }
  }
  CHECK(judged > 0);
}
