// compare(): error measures in one pass over both tensors (see compare.h).
#include "validation/compare.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace kcp::val {
namespace {

// bfloat16 bit pattern mapped to a monotonic integer line, so ULP distance is a difference.
int32_t bf16_ordinal(double x) {
  const uint16_t b = float_to_bf16(float(x));
  return (b & 0x8000u) ? -int32_t(b & 0x7fffu) : int32_t(b);
}

Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

}  // namespace

std::string index_str(const Shape& idx) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < idx.size(); ++i) os << (i ? "," : "") << idx[i];
  os << ')';
  return os.str();
}

Metrics compare(const TensorView& av, const TensorView& bv) {
  KCP_CHECK(av.shape == bv.shape, "compare: shapes differ, ", shape_str(av.shape), " vs ", shape_str(bv.shape));
  const Tensor<double> a = to_tensor<double>(av), b = to_tensor<double>(bv);
  Metrics m;
  m.n = a.numel();
  double diff2 = 0, b2 = 0, a2 = 0, ab = 0;
  int64_t worst = -1;
  for (int64_t i = 0; i < m.n; ++i) {
    const double x = a.data()[i], y = b.data()[i];
    m.nan_a += std::isnan(x), m.nan_b += std::isnan(y);
    m.inf_a += std::isinf(x), m.inf_b += std::isinf(y);
    if (std::isnan(x) || std::isnan(y)) continue;
    if (std::isinf(x) || std::isinf(y)) {
      m.inf_mismatch += !(x == y);
      continue;
    }
    if (x != 0) m.a_nonzero++, m.a_bf16_exact += double(bf16_to_float(float_to_bf16(float(x)))) == x;
    const double d = std::abs(x - y);
    if (worst < 0 || d > m.max_abs) m.max_abs = d, worst = i;
    diff2 += d * d, b2 += y * y, a2 += x * x, ab += x * y;
    m.max_bf16_ulp = std::max(m.max_bf16_ulp, double(std::abs(bf16_ordinal(x) - bf16_ordinal(y))));
  }
  if (worst >= 0) {
    m.max_abs_at = unravel(worst, a.shape());
    m.a_at = a.data()[worst], m.b_at = b.data()[worst];
  }
  const double nn = double(std::max<int64_t>(m.n, 1));
  m.ref_rms = std::sqrt(b2 / nn);
  m.rel_l2 = b2 > 0 ? std::sqrt(diff2 / b2) : (diff2 > 0 ? INFINITY : 0.0);
  m.fla_ratio = std::sqrt(diff2 / nn) / (m.ref_rms + 1e-8);
  m.cosine = (a2 > 0 && b2 > 0) ? ab / std::sqrt(a2 * b2) : (a2 == b2 ? 1.0 : 0.0);
  if (m.nan_a || m.nan_b) m.rel_l2 = m.fla_ratio = NAN;
  return m;
}

std::vector<Mismatch> first_mismatches(const TensorView& av, const TensorView& bv, double abs_threshold,
                                       int max_count) {
  KCP_CHECK(av.shape == bv.shape, "first_mismatches: shapes differ, ", shape_str(av.shape), " vs ",
            shape_str(bv.shape));
  const Tensor<double> a = to_tensor<double>(av), b = to_tensor<double>(bv);
  std::vector<Mismatch> out;
  for (int64_t i = 0; i < a.numel() && int(out.size()) < max_count; ++i) {
    const double x = a.data()[i], y = b.data()[i];
    const bool bad = std::isnan(x) || std::isnan(y) || ((std::isinf(x) || std::isinf(y)) ? x != y
                                                                                          : std::abs(x - y) > abs_threshold);
    if (bad) out.push_back({unravel(i, a.shape()), x, y});
  }
  return out;
}

}  // namespace kcp::val
