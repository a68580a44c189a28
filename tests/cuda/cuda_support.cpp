// Staging and checking helpers for the CUDA suites (see cuda_support.h).
#include "tests/cuda/cuda_support.h"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <bit>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda/backend_cuda.h"
#include "reference/chunkwise.h"
#include "validation/compare.h"
#include "validation/tolerance.h"

namespace kcp::test {

bool gpu_present() { return cuda::device_count() > 0; }

StreamGate::StreamGate(Backend& be) {
  // the host function owns a reference, so the flag outlives the gate if the gate goes first
  auto* held = new std::shared_ptr<std::atomic<bool>>(open_);
  auto wait = [](void* arg) {
    std::unique_ptr<std::shared_ptr<std::atomic<bool>>> flag(static_cast<std::shared_ptr<std::atomic<bool>>*>(arg));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!(*flag)->load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  const cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(be.queue().native_stream()), wait, held);
  if (e != cudaSuccess) delete held;
  REQUIRE_MESSAGE(e == cudaSuccess, "cudaLaunchHostFunc: ", cudaGetErrorString(e));
}

int64_t cuda_chunk_count(const Problem& p) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.N; ++i) n += ref::chunk_count(p.sequence(i).len, 64);
  return n;
}

val::CaseSpec transition_case_spec(Variant var, DType qkv, uint64_t seed) {
  val::CaseSpec s;
  s.variant = var, s.seqlens = {70, 0, 130, 1}, s.H = 1, s.HV = 2, s.K = 64, s.V = 32;
  s.flags.use_qk_l2norm_in_kernel = var == Variant::kda;
  s.flags.use_beta_sigmoid_in_kernel = var == Variant::gdn;
  s.seed = seed + uint64_t(qkv == DType::f32);
  return s;
}

val::CaseData round_case(val::CaseData c, DType qkv, DType gates) {
  auto round_all = [](Tensor<double>& t, DType dt) {
    for (double& x : t.vec()) x = round_to(dt, x);
  };
  round_all(c.q, qkv), round_all(c.k, qkv), round_all(c.v, qkv), round_all(c.g, gates);
  for (Tensor<double>* t : {&c.beta, &c.A_log, &c.dt_bias, &c.h0}) round_all(*t, DType::f32);
  return c;
}

DeviceTensor device_tensor(Backend& be, DType dt, const Shape& shape) { return DeviceTensor(be.queue(), dt, shape); }

void poison(Backend& be, const TensorView& dst) {
  const std::vector<unsigned char> ones(size_t(dst.numel()) * size_t(dtype_size(dst.dtype)), 0xff);
  if (!ones.empty()) be.queue().copy(dst.data, ones.data(), ones.size(), CopyKind::host_to_device);
  be.synchronize();
}

DeviceTensor poisoned(Backend& be, DType dt, const Shape& shape) {
  DeviceTensor d = device_tensor(be, dt, shape);
  poison(be, d.view);
  return d;
}

void upload_into(Backend& be, const TensorView& dst, const Tensor<double>& src) {
  KCP_CHECK(dst.numel() == src.numel(), "upload_into: ", dst.numel(), " elements vs ", src.numel());
  std::vector<unsigned char> host(size_t(src.numel()) * size_t(dtype_size(dst.dtype)));
  const TensorView hv(host.data(), dst.dtype, dst.shape);
  if (src.numel()) view_store<double>(hv, 0, src.numel(), 1, src.data());
  if (!host.empty()) be.queue().copy(dst.data, host.data(), host.size(), CopyKind::host_to_device);
  be.synchronize();
}

DeviceTensor to_device(Backend& be, const Tensor<double>& t, DType dt) {
  DeviceTensor d = device_tensor(be, dt, t.shape());
  upload_into(be, d.view, t);
  return d;
}

Tensor<double> to_host(Backend& be, const TensorView& v) {
  std::vector<unsigned char> host(size_t(v.numel()) * size_t(dtype_size(v.dtype)));
  if (!host.empty()) be.queue().copy(host.data(), v.data, host.size(), CopyKind::device_to_host);
  be.synchronize();
  return to_tensor<double>(TensorView(host.data(), v.dtype, v.shape));
}

int64_t count_not_tf32(Backend& be, const TensorView& v) {
  KCP_CHECK(v.dtype == DType::f32, "count_not_tf32: expected a float32 tensor");
  const Tensor<double> host = to_host(be, v);  // float32 -> float64 -> float32 keeps every bit
  int64_t n = 0;
  for (const double x : host.vec()) n += (std::bit_cast<uint32_t>(float(x)) & 0x1fffu) != 0;
  return n;
}

DeviceInputs upload_inputs(Backend& be, const val::CaseData& c, DType qkv, DType gates) {
  DeviceInputs d;
  d.tensors.reserve(8);
  auto put = [&](const Tensor<double>& t, DType dt) -> TensorView {
    if (t.empty()) return {};
    d.tensors.push_back(to_device(be, t, dt));
    return d.tensors.back().view;
  };
  d.views.q = put(c.q, qkv), d.views.k = put(c.k, qkv), d.views.v = put(c.v, qkv);
  d.views.g = put(c.g, gates), d.views.beta = put(c.beta, DType::f32);
  d.views.A_log = put(c.A_log, DType::f32), d.views.dt_bias = put(c.dt_bias, DType::f32);
  d.views.initial_state = put(c.h0, DType::f32);
  return d;
}

bool check_rel_l2(const std::string& what, const std::string& name, const Tensor<double>& got, const TensorView& ref,
                  double bar) {
  const val::Metrics m = val::compare(got.view(), ref);
  std::printf("  %-16s rel_l2 %.3e  max_abs %.3e  (bar %.1e)  %s\n", what.c_str(), m.rel_l2, m.max_abs, bar, name.c_str());
  INFO(what, ": rel_l2 ", m.rel_l2, ", max_abs ", m.max_abs, " at ", val::index_str(m.max_abs_at), " (", m.a_at,
       " vs ", m.b_at, "), NaN ", m.nan_a);
  CHECK(m.nan_a == 0);
  CHECK(m.finite_ok());
  CHECK(m.rel_l2 <= bar);
  return m.rel_l2 <= bar && m.nan_a == 0 && m.finite_ok();
}

DeviceGrads device_grads(Backend& be, const val::GradSet<double>& host, DType qkv) {
  DeviceGrads d;
  auto put = [&](const char* name, const Tensor<double>& h, DType dt, TensorView& v) {
    if (h.empty()) return;
    d.t.push_back({name, poisoned(be, dt, h.shape()), &h});
    v = d.t.back().t.view;  // the buffer's address: unchanged when the vector moves its entries
  };
  put("dq", host.dq, qkv, d.views.dq), put("dk", host.dk, qkv, d.views.dk), put("dv", host.dv, qkv, d.views.dv);
  put("dg", host.dg, DType::f32, d.views.dg), put("dbeta", host.dbeta, DType::f32, d.views.dbeta);
  put("dinitial_state", host.dh0, DType::f32, d.views.d_initial_state);
  put("dA_log", host.dA_log, DType::f32, d.views.dA_log), put("ddt_bias", host.ddt_bias, DType::f32, d.views.ddt_bias);
  return d;
}

double fla_chunk_bar(const std::string& grad) {
  const bool gate = grad == "dg" || grad == "dbeta" || grad == "dA_log" || grad == "ddt_bias";
  return gate ? val::tol::kFlaChunkGateBeta : val::tol::kFlaChunkGrad;
}

}  // namespace kcp::test
