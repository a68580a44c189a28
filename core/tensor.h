// Tensors at kcp's boundaries.
//   TensorView: a non-owning, strided, typed-at-run-time view (host or CUDA memory). Every backend
//               entry point takes views, so one interface serves float64 oracles and bf16 kernels.
//   Tensor<S>:  an owning, contiguous, row-major host array for tests, the harness and the oracle.
// Strides are in elements (int64). Shapes follow FLA: [B,T,H,K], [B,T,HV,V], [N,HV,K,V], ...
// Covered by tests/core/test_tensor.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace kcp {

using Shape = std::vector<int64_t>;
enum class Device { host, cuda };

std::string shape_str(const Shape& s);     // "[1,64,2,32]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);  // row-major

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::host;
  Shape shape;
  Shape stride;  // elements; same rank as shape

  TensorView() = default;
  TensorView(void* p, DType t, Shape s, Device d = Device::host)
      : data(p), dtype(t), device(d), shape(std::move(s)), stride(contiguous_strides(shape)) {}

  bool empty() const { return data == nullptr; }
  int rank() const { return int(shape.size()); }
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? i + rank() : i)); }
  int64_t numel() const { return shape_numel(shape); }
  bool contiguous() const { return stride == contiguous_strides(shape); }

  // Typed pointer; throws if the dtype does not match.
  template <class T> T* ptr() const {
    KCP_CHECK(dtype == dtype_of<std::remove_const_t<T>>(), "tensor view holds ",
              dtype_name(dtype), ", not ", dtype_name(dtype_of<std::remove_const_t<T>>()));
    return static_cast<T*>(data);
  }
  // Offset of a multi-index in elements.
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t o = 0;
    size_t i = 0;
    for (int64_t x : idx) o += x * stride[i++];
    return o;
  }
  // The sub-view [lo, lo+len) along `axis`, sharing memory (an empty view stays empty).
  TensorView narrow(int axis, int64_t lo, int64_t len) const {
    if (empty()) return {};
    TensorView s = *this;
    s.data = static_cast<char*>(data) + lo * stride.at(size_t(axis)) * dtype_size(dtype);
    s.shape[size_t(axis)] = len;
    return s;
  }
  // The sub-view [0, extent[i]) on every axis, sharing memory: the leading corner a zero-padded
  // tensor keeps its values in (same rank; every extent within this view's).
  TensorView leading(const Shape& extent) const {
    KCP_CHECK(extent.size() == shape.size(), "leading: rank ", extent.size(), " for a view of rank ", shape.size());
    TensorView c = *this;
    for (size_t i = 0; i < extent.size(); ++i) {
      KCP_CHECK(extent[i] <= shape[i], "leading: extent ", extent[i], " > ", shape[i], " on axis ", i);
      c = c.narrow(int(i), 0, extent[i]);
    }
    return c;
  }
  // Host element read/write with conversion to/from double (slow path: harness, checks).
  double get(int64_t elem_offset) const;
  void set(int64_t elem_offset, double value) const;
};

// Reads n elements spaced `step` apart starting at `elem_offset`, converting to S. The reference
// algorithms load whole rows this way, so the per-element dtype switch happens once per row.
template <class S> void view_load(const TensorView& v, int64_t elem_offset, int64_t n, int64_t step, S* out);
template <class S> void view_store(const TensorView& v, int64_t elem_offset, int64_t n, int64_t step, const S* in);

// Owning contiguous host tensor.
template <class S>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, S fill = S(0))
      : shape_(std::move(shape)), data_(size_t(shape_numel(shape_)), fill) {}

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(size_t(i)); }
  int64_t numel() const { return int64_t(data_.size()); }
  bool empty() const { return data_.empty() && shape_.empty(); }
  S* data() { return data_.data(); }
  const S* data() const { return data_.data(); }
  std::vector<S>& vec() { return data_; }
  const std::vector<S>& vec() const { return data_; }

  template <class... I> S& operator()(I... idx) { return data_[size_t(index({int64_t(idx)...}))]; }
  template <class... I> const S& operator()(I... idx) const { return data_[size_t(index({int64_t(idx)...}))]; }

  // A view of this tensor; an empty Tensor gives an empty view (an absent optional input).
  // A zero-element tensor (e.g. T = 0) is present, so its view points at a dummy, never at null.
  TensorView view() const {
    if (shape_.empty() && data_.empty()) return {};
    static S dummy{};
    return TensorView(data_.empty() ? &dummy : const_cast<S*>(data_.data()), dtype_of<S>(), shape_);
  }

 private:
  int64_t index(std::initializer_list<int64_t> idx) const {
    int64_t o = 0;
    size_t i = 0;
    for (int64_t x : idx) o = o * shape_[i++] + x;
    return o;
  }
  Shape shape_;
  std::vector<S> data_;
};

// Copies any host view (any dtype, any strides) into a contiguous Tensor<S>.
template <class S> Tensor<S> to_tensor(const TensorView& v);

}  // namespace kcp
