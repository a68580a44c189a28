// Host-side view access: element get/set and row load/store with dtype conversion.
#include "core/tensor.h"

#include <algorithm>
#include <sstream>
#include <type_traits>

namespace kcp {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {
// Calls f(typed_pointer, to_wide, from_wide) for the view's element type, so the loops below are
// written once for every dtype.
template <class F>
void dispatch(const TensorView& v, F&& f) {
  switch (v.dtype) {
    case DType::f64: f(static_cast<double*>(v.data), [](double x) { return x; }, [](double x) { return x; }); break;
    case DType::f32: f(static_cast<float*>(v.data), [](float x) { return x; }, [](double x) { return float(x); }); break;
    case DType::bf16: f(static_cast<uint16_t*>(v.data), bf16_to_float, [](double x) { return float_to_bf16(float(x)); }); break;
    case DType::f16: f(static_cast<uint16_t*>(v.data), f16_to_float, [](double x) { return float_to_f16(float(x)); }); break;
    case DType::i32: f(static_cast<int32_t*>(v.data), [](int32_t x) { return x; }, [](double x) { return int32_t(x); }); break;
    case DType::i64: f(static_cast<int64_t*>(v.data), [](int64_t x) { return x; }, [](double x) { return int64_t(x); }); break;
  }
}
}  // namespace

double TensorView::get(int64_t o) const {
  double x = 0;
  view_load<double>(*this, o, 1, 1, &x);
  return x;
}

void TensorView::set(int64_t o, double x) const { view_store<double>(*this, o, 1, 1, &x); }

template <class S>
void view_load(const TensorView& v, int64_t off, int64_t n, int64_t step, S* out) {
  KCP_CHECK(v.device == Device::host, "view_load on a device view");
  dispatch(v, [&](auto* p, auto widen, auto) {
    const auto* src = p + off;
    if (step == 1) {  // the common contiguous row: a loop the compiler vectorizes
      for (int64_t i = 0; i < n; ++i) out[i] = S(widen(src[i]));
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = S(widen(src[i * step]));
  });
}

template <class S>
void view_store(const TensorView& v, int64_t off, int64_t n, int64_t step, const S* in) {
  KCP_CHECK(v.device == Device::host, "view_store on a device view");
  dispatch(v, [&](auto* p, auto, auto narrow) {
    auto* dst = p + off;
    using Elem = std::remove_reference_t<decltype(*dst)>;
    if constexpr (std::is_same_v<Elem, S>) {  // same type: no rounding, a plain copy
      if (step == 1) {
        std::copy(in, in + n, dst);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) dst[i * step] = narrow(double(in[i]));
  });
}

template <class S>
Tensor<S> to_tensor(const TensorView& v) {
  Tensor<S> t(v.shape);
  const int r = v.rank();
  Shape idx(size_t(r), 0);
  if (t.numel() == 0) return t;
  // Walk the view row by row along its last axis.
  const int64_t inner = r ? v.shape[size_t(r - 1)] : 1, step = r ? v.stride[size_t(r - 1)] : 1;
  for (int64_t row = 0, out = 0; out < t.numel(); ++row, out += inner) {
    int64_t off = 0, rem = row;
    for (int d = r - 2; d >= 0; --d) {
      off += (rem % v.shape[size_t(d)]) * v.stride[size_t(d)];
      rem /= v.shape[size_t(d)];
    }
    view_load<S>(v, off, inner, step, t.data() + out);
  }
  return t;
}

template void view_load<double>(const TensorView&, int64_t, int64_t, int64_t, double*);
template void view_load<float>(const TensorView&, int64_t, int64_t, int64_t, float*);
template void view_load<int64_t>(const TensorView&, int64_t, int64_t, int64_t, int64_t*);
template void view_store<double>(const TensorView&, int64_t, int64_t, int64_t, const double*);
template void view_store<float>(const TensorView&, int64_t, int64_t, int64_t, const float*);
template Tensor<double> to_tensor<double>(const TensorView&);
template Tensor<float> to_tensor<float>(const TensorView&);
template Tensor<int64_t> to_tensor<int64_t>(const TensorView&);

}  // namespace kcp
