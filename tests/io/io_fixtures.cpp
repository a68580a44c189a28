// TempDir and dump_from_case (see io_fixtures.h).
#include "tests/io/io_fixtures.h"

#include <unistd.h>

#include <cmath>

namespace kcp::test {

TempDir::TempDir(const std::string& name)
    : path(std::filesystem::current_path() / ("tmp_" + name + "_" + std::to_string(::getpid()))) {
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

size_t TempDir::count() const {
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(path); it != std::filesystem::directory_iterator(); ++it) ++n;
  return n;
}

io::Array array_of(const Tensor<double>& x, DType t) {
  io::Array a(t, x.shape());
  view_store<double>(a.view(), 0, x.numel(), 1, x.data());
  return a;
}

io::Dump dump_from_case(const val::CaseData& c, DType stored, io::Encoding encoding) {
  io::Dump d;
  d.op = std::string(variant_name(c.spec.variant));
  const Flags& f = c.spec.flags;
  d.attrs = {{"format", std::string(io::kDumpFormat)}, {"format_version", io::kDumpVersion}, {"op", d.op},
             {"case", c.spec.name()}, {"seed", int64_t(c.spec.seed)}, {"producer", std::string("kcp-test")},
             {"input_dtype", std::string(dtype_name(stored))}, {"chunk_size", c.spec.chunk_size},
             {"use_qk_l2norm_in_kernel", f.use_qk_l2norm_in_kernel},
             {"use_beta_sigmoid_in_kernel", f.use_beta_sigmoid_in_kernel},
             {"use_gate_in_kernel", f.use_gate_in_kernel}, {"safe_gate", f.safe_gate},
             {"allow_neg_eigval", f.allow_neg_eigval}, {"state_layout", std::string(f.state_v_first ? "VK" : "KV")},
             {"lower_bound", f.lower_bound ? *f.lower_bound : NAN}};
  if (c.spec.scale) d.attrs["scale"] = *c.spec.scale;
  io::DumpGroup& in = d.add_group("inputs");
  const std::pair<const char*, const Tensor<double>*> tensors[] = {
      {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"g", &c.g}, {"beta", &c.beta}, {"A_log", &c.A_log},
      {"dt_bias", &c.dt_bias}, {"initial_state", &c.h0}, {"do", &c.d_o}, {"dht", &c.dht}};
  for (auto [name, t] : tensors) {
    if (t->empty()) continue;
    // states and gate parameters are float32 in FLA and Megatron whatever the input dtype
    const bool f32_always = std::string(name) == "initial_state" || std::string(name) == "dht" ||
                            std::string(name) == "A_log" || std::string(name) == "dt_bias";
    const DType t_stored = f32_always && stored != DType::f64 ? DType::f32 : stored;
    in.add(name, array_of(*t, t_stored), t_stored, t_stored == DType::bf16 ? encoding : io::Encoding::ieee);
  }
  if (!c.cu_seqlens.empty()) {
    io::Array cu(DType::i64, {int64_t(c.cu_seqlens.size())});
    std::copy(c.cu_seqlens.begin(), c.cu_seqlens.end(), static_cast<int64_t*>(cu.data()));
    in.add("cu_seqlens", std::move(cu), DType::i64);
  }
  return d;
}

}  // namespace kcp::test
