// make_bench_inputs (see bench_inputs.h).
#include "app/bench_inputs.h"

#include <cmath>

#include "core/rng.h"

namespace kcp::app {
namespace {

// Elements [first, first+n) of a counter-based stream, as float.
std::vector<float> draw(int64_t first, int64_t n, uint64_t seed, uint64_t stream, bool normal, double lo = 0,
                        double hi = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  const CounterRng rng{seed, stream};
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = float(normal ? rng.normal(uint64_t(first + i)) : rng.uniform(uint64_t(first + i), lo, hi));
  return v;
}

void l2normalize_rows(std::vector<float>& x, int64_t D) {
#pragma omp parallel for
  for (int64_t r = 0; r < int64_t(x.size()) / D; ++r) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(x[size_t(r * D + d)]) * x[size_t(r * D + d)];
    for (int64_t d = 0; d < D; ++d) x[size_t(r * D + d)] = float(x[size_t(r * D + d)] / std::sqrt(s));
  }
}

// Host values rounded to `dt` (bit patterns for bf16/f16), uploaded into a new device buffer.
TensorView put(Backend& be, BenchInputs& out, const std::vector<float>& x, DType dt, Shape shape) {
  std::vector<char> bytes(x.size() * size_t(dtype_size(dt)));
#pragma omp parallel for
  for (int64_t i = 0; i < int64_t(x.size()); ++i) {
    if (dt == DType::f32) reinterpret_cast<float*>(bytes.data())[i] = x[size_t(i)];
    else reinterpret_cast<uint16_t*>(bytes.data())[i] = dt == DType::bf16 ? float_to_bf16(x[size_t(i)]) : float_to_f16(x[size_t(i)]);
  }
  out.buffers.emplace_back(be.queue(), bytes.size());
  be.queue().copy(out.buffers.back().get(), bytes.data(), bytes.size(), CopyKind::host_to_device);
  be.synchronize();  // `bytes` is freed on return
  return TensorView(out.buffers.back().get(), dt, std::move(shape), be.device());
}

}  // namespace

Flags BenchShape::flags() const {
  KCP_CHECK(!fused || variant != Variant::gla, "bench: --fused 1 is for gdn and kda (the gate formulas with A_log, dt_bias)");
  Flags f;
  f.use_qk_l2norm_in_kernel = f.use_beta_sigmoid_in_kernel = f.use_gate_in_kernel = fused;
  return f;
}

BenchInputs make_bench_inputs(Backend& be, const BenchShape& s, int64_t t0, int64_t T, uint64_t seed, bool with_do) {
  const int64_t H = s.H, K = s.K, V = s.V, gw = s.variant == Variant::gdn ? 1 : K;
  BenchInputs b;
  std::vector<float> q = draw(t0 * H * K, T * H * K, seed, 1, true), k = draw(t0 * H * K, T * H * K, seed, 2, true);
  if (!s.fused) l2normalize_rows(q, K), l2normalize_rows(k, K);  // fused: the kernel normalizes
  b.in.q = put(be, b, q, s.qkv, {1, T, H, K});
  b.in.k = put(be, b, k, s.qkv, {1, T, H, K});
  b.in.v = put(be, b, draw(t0 * H * V, T * H * V, seed, 3, true), s.qkv, {1, T, H, V});
  const Shape gs = s.variant == Variant::gdn ? Shape{1, T, H} : Shape{1, T, H, K};
  if (s.fused) {  // raw gate, its parameters (per head, not per token: the same on every rank), beta logits
    b.in.g = put(be, b, draw(t0 * H * gw, T * H * gw, seed, 4, false, -1.0, 1.0), DType::f32, gs);
    b.in.A_log = put(be, b, draw(0, H, seed, 7, false, -1.0, 0.0), DType::f32, {H});
    b.in.dt_bias = put(be, b, draw(0, H * gw, seed, 8, false, -4.0, -3.0), DType::f32, {H * gw});
    b.in.beta = put(be, b, draw(t0 * H, T * H, seed, 5, true), DType::f32, {1, T, H});
  } else {
    b.in.g = put(be, b, draw(t0 * H * gw, T * H * gw, seed, 4, false, -0.3, -0.001), DType::f32, gs);
    if (s.variant != Variant::gla)
      b.in.beta = put(be, b, draw(t0 * H, T * H, seed, 5, false, 0.0, 1.0), DType::f32, {1, T, H});
  }
  if (with_do) b.d_o = put(be, b, draw(t0 * H * V, T * H * V, seed, 6, true), s.qkv, {1, T, H, V});
  return b;
}

}  // namespace kcp::app
