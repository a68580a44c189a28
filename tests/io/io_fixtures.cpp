// TempDir and dump_from_case (see io_fixtures.h).
#include "tests/io/io_fixtures.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

namespace {

io::Array slice_axis(const io::Array& a, size_t axis, int64_t begin, int64_t end) {
  Shape s = a.shape;
  int64_t outer = 1, inner = dtype_size(a.dtype);
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t full = s[axis];
  s[axis] = end - begin;
  io::Array out(a.dtype, s);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(static_cast<char*>(out.data()) + o * (end - begin) * inner,
                static_cast<const char*>(a.data()) + (o * full + begin) * inner, size_t((end - begin) * inner));
  return out;
}

bool in(const std::string& x, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (x == n) return true;
  return false;
}

// The dataset's part on `rank`, or the whole (nullptr-free) when every rank holds all of it.
io::Array shard_of(const io::DumpDataset& ds, int64_t rank, int64_t P, bool tokens) {
  const io::Array& a = ds.data;
  const bool per_token = in(ds.name, {"q", "k", "v", "g", "beta", "do", "o", "dq", "dk", "dv", "dg", "dbeta"});
  const bool state = in(ds.name, {"initial_state", "dht", "final_state", "dinitial_state"});
  const bool param = in(ds.name, {"A_log", "dt_bias", "dA_log", "ddt_bias"});
  const size_t axis = tokens ? 1 : per_token ? 2 : state ? 1 : 0;
  if (tokens && in(ds.name, {"dA_log", "ddt_bias"})) {  // each rank holds a partial sum
    Tensor<double> x = to_tensor<double>(a.view());
    for (double& v : x.vec()) v /= double(P);
    return array_of(x, a.dtype);
  }
  if ((tokens && !per_token) || (!tokens && !per_token && !state && !param)) return a;
  const int64_t part = a.shape[axis] / P;
  return slice_axis(a, axis, rank * part, (rank + 1) * part);
}

}  // namespace

io::Dump dump_shard(const io::Dump& global, int64_t rank, int64_t P, bool tokens) {
  io::Dump d = global;
  const io::Array& v = global.group("inputs")->find("v")->data;
  const int64_t T = v.shape[1], HV = v.shape[2];
  for (io::DumpGroup& g : d.groups) {
    if (tokens)  // FLA's chunkwise CP forbids initial and final states
      std::erase_if(g.datasets, [](const io::DumpDataset& x) {
        return in(x.name, {"initial_state", "dht", "final_state", "dinitial_state"});
      });
    for (io::DumpDataset& ds : g.datasets) {
      ds.data = shard_of(ds, rank, P, tokens);
      if (tokens && ds.name == "cu_seqlens") ds.attrs["scope"] = std::string("global");
    }
  }
  d.attrs["cp_size"] = P, d.attrs["cp_rank"] = rank;
  d.attrs["cp_mode"] = std::string(tokens ? "chunkwise" : "headwise");
  d.attrs["token_offset"] = tokens ? rank * (T / P) : int64_t(0);
  d.attrs["head_offset"] = tokens ? int64_t(0) : rank * (HV / P);
  if (tokens) {  // FLA's context fields (ALGORITHMS.md 5.1)
    std::vector<int64_t> cu = {0, T};
    if (const io::DumpDataset* c = global.group("inputs")->find("cu_seqlens"))
      cu = to_tensor<int64_t>(c->data.view()).vec();
    const int64_t part = T / P, lo = rank * part, hi = lo + part;
    int64_t first_start = 0, last_end = T;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      if (cu[s] <= lo && cu[s + 1] > lo) first_start = cu[s];
      if (cu[s] < hi && cu[s + 1] >= hi) last_end = cu[s + 1];
    }
    d.attrs["cp_pre_num_ranks"] = rank - first_start / part;
    d.attrs["cp_post_num_ranks"] = (last_end - 1) / part - rank;
    d.attrs["cp_pre_num_conv_tokens"] = std::max<int64_t>(0, lo - first_start);
  }
  for (const char* k : {"B", "T", "H", "HV", "K", "V", "N"}) d.attrs.erase(k);
  return d;
}

}  // namespace kcp::test
