// The host queue: memory from malloc, copies by memcpy, view operations by element loops through
// the views' strides, the transition algebra by plain loops in the buffer's precision (these are the
// reference the CUDA queue is tested against, and small: [HV,K,V+K] per element).
#include "core/queue.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/transition.h"

namespace kcp {
namespace {

void check_same_shape(const TensorView& dst, const TensorView& src, const char* what) {
  KCP_CHECK(dst.shape == src.shape, what, ": shapes differ: dst ", shape_str(dst.shape), ", src ", shape_str(src.shape));
  KCP_CHECK(dst.rank() <= 4, what, ": views of rank <= 4, got ", dst.rank());
}

// Calls f(dst offset, src offset) for every element of a rank <= 4 view pair.
template <class F>
void for_each_element(const TensorView& dst, const TensorView& src, F f) {
  Shape s = dst.shape, ds = dst.stride, ss = src.stride;
  while (s.size() < 4) s.insert(s.begin(), 1), ds.insert(ds.begin(), 0), ss.insert(ss.begin(), 0);
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d)
          f(a * ds[0] + b * ds[1] + c * ds[2] + d * ds[3], a * ss[0] + b * ss[1] + c * ss[2] + d * ss[3]);
}

// A [HV, K, X] strided matrix set of a packed element, typed.
template <class S>
struct Heads {
  S* p;
  int64_t sh, sr, sc;  // strides: head, row, column
  S& at(int64_t h, int64_t r, int64_t c) const { return p[h * sh + r * sr + c * sc]; }
};
template <class S> Heads<S> heads(const TensorView& v) { return {v.ptr<S>(), v.stride[0], v.stride[1], v.stride[2]}; }

// out[h] = A[h] (K x K) * X[h] (K x N) + (add ? C[h] : 0); out must not alias A or X.
template <class S>
void head_products(int64_t HV, int64_t K, int64_t N, Heads<S> a, Heads<S> x, const Heads<S>* c, Heads<S> out) {
  std::vector<S> acc(static_cast<size_t>(N));
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < N; ++j) acc[size_t(j)] = c ? c->at(h, i, j) : S(0);
      for (int64_t q = 0; q < K; ++q) {
        const S aiq = a.at(h, i, q);
        for (int64_t j = 0; j < N; ++j) acc[size_t(j)] += aiq * x.at(h, q, j);
      }
      for (int64_t j = 0; j < N; ++j) out.at(h, i, j) = acc[size_t(j)];
    }
}

template <class S>
void fold(const TensorView& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0,
          const TensorView& out) {
  const int64_t HV = out.dim(0), K = out.dim(1), V = out.dim(2);
  Tensor<S> x({HV, K, V}), next({HV, K, V});
  if (!x0.empty()) x = to_tensor<S>(x0);
  for (int64_t step = 0; step < count; ++step) {
    const TensorView e = transition_element(elems, reverse ? first + count - 1 - step : first + step);
    const Heads<S> sx = heads<S>(transition_s(e));
    head_products<S>(HV, K, V, heads<S>(transition_m(e)), heads<S>(x.view()), &sx, heads<S>(next.view()));
    std::swap(x, next);
  }
  const Heads<S> o = heads<S>(out);
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) o.at(h, i, j) = x(h, i, j);
}

template <class S>
void compose(const TensorView& later, const TensorView& earlier, const TensorView& out) {
  const int64_t HV = later.dim(0), K = later.dim(1), V = later.dim(2) - K;
  const Heads<S> ls = heads<S>(transition_s(later));
  // out = M_l [S_e | M_e] + [S_l | 0]
  head_products<S>(HV, K, V, heads<S>(transition_m(later)), heads<S>(transition_s(earlier)), &ls,
                   heads<S>(transition_s(out)));
  head_products<S>(HV, K, K, heads<S>(transition_m(later)), heads<S>(transition_m(earlier)), nullptr,
                   heads<S>(transition_m(out)));
}

template <class S>
void start(const TensorView& t, const TensorView& x0) {
  const int64_t HV = t.dim(0), K = t.dim(1), V = t.dim(2) - K;
  const Heads<S> s = heads<S>(transition_s(t)), m = heads<S>(transition_m(t));
  if (!x0.empty()) {
    const Tensor<S> x = to_tensor<S>(x0), s_old = to_tensor<S>(transition_s(t));
    const Heads<S> so = heads<S>(s_old.view());
    head_products<S>(HV, K, V, m, heads<S>(x.view()), &so, s);
  }
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t q = 0; q < K; ++q) m.at(h, i, q) = S(0);
}

template <class S>
void identity(const TensorView& t) {
  const int64_t HV = t.dim(0), K = t.dim(1), V = t.dim(2) - K;
  const Heads<S> e = heads<S>(t);
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V + K; ++j) e.at(h, i, j) = S(j == V + i ? 1 : 0);
}

// Runs f<S>() for the float dtype of a transition buffer.
template <class F>
void by_precision(const TensorView& t, const char* what, F f) {
  KCP_CHECK(t.dtype == DType::f64 || t.dtype == DType::f32, what, ": transitions are float32 or float64, got ",
            dtype_name(t.dtype));
  if (t.dtype == DType::f64) f(double{});
  else f(float{});
}

class HostQueue final : public Queue {
 public:
  Device device() const override { return Device::host; }
  std::string describe() const override { return "host"; }

  void* alloc(size_t bytes) override {
    void* p = std::malloc(bytes ? bytes : 1);
    KCP_CHECK(p, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void release(void* ptr) noexcept override { std::free(ptr); }
  void* alloc_host(size_t bytes) override { return alloc(bytes); }
  void release_host(void* ptr) noexcept override { std::free(ptr); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void synchronize() override {}
  double time_ms(const std::function<void()>& body) override {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void copy_view(const TensorView& dst, const TensorView& src) override {
    check_same_shape(dst, src, "copy_view");
    for_each_element(dst, src, [&](int64_t d, int64_t s) { dst.set(d, src.get(s)); });
  }
  void add_view(const TensorView& dst, const TensorView& src) override {
    check_same_shape(dst, src, "add_view");
    for_each_element(dst, src, [&](int64_t d, int64_t s) { dst.set(d, dst.get(d) + src.get(s)); });
  }
  void fill_zero(const TensorView& dst) override {
    KCP_CHECK(dst.rank() <= 4, "fill_zero: views of rank <= 4, got ", dst.rank());
    for_each_element(dst, dst, [&](int64_t d, int64_t) { dst.set(d, 0.0); });
  }

  void transition_fold(const TensorView& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0,
                       const TensorView& out) override {
    KCP_CHECK(first >= 0 && count >= 0 && first + count <= elems.dim(0), "transition_fold: range [", first, ", ",
              first + count, ") outside [0, ", elems.dim(0), ")");
    by_precision(elems, "transition_fold", [&](auto s) { fold<decltype(s)>(elems, first, count, reverse, x0, out); });
  }
  void transition_compose(const TensorView& later, const TensorView& earlier, const TensorView& out) override {
    by_precision(later, "transition_compose", [&](auto s) { compose<decltype(s)>(later, earlier, out); });
  }
  void transition_start(const TensorView& t, const TensorView& x0) override {
    by_precision(t, "transition_start", [&](auto s) { start<decltype(s)>(t, x0); });
  }
  void transition_identity(const TensorView& t) override {
    by_precision(t, "transition_identity", [&](auto s) { identity<decltype(s)>(t); });
  }
};

}  // namespace

// The scan as one fold per element, each starting from the previous element's output (works on any
// queue; a device queue may run the ranges in parallel instead, as the CUDA queue does).
void Queue::transition_scan(const TensorView& elems, const std::vector<TransitionRange>& ranges,
                            const TensorView& out) {
  KCP_CHECK(elems.rank() == 4 && out.rank() == 4 && out.dim(0) == elems.dim(0) && out.dim(1) == elems.dim(1) &&
                out.dim(2) == elems.dim(2) && out.dim(3) == elems.dim(3) - elems.dim(2),
            "transition_scan: expected elems [E,HV,K,V+K] and out [E,HV,K,V], got ", shape_str(elems.shape), " and ",
            shape_str(out.shape));
  KCP_CHECK(out.dtype == elems.dtype && out.contiguous(), "transition_scan: out must be contiguous in the elements' dtype");
  for (const TransitionRange& r : ranges) {
    KCP_CHECK(r.first >= 0 && r.count >= 0 && r.first + r.count <= elems.dim(0), "transition_scan: range [", r.first,
              ", ", r.first + r.count, ") outside [0, ", elems.dim(0), ")");
    for (int64_t j = r.first; j < r.first + r.count; ++j)
      transition_fold(elems, j, 1, false, j == r.first ? TensorView() : transition_element(out, j - 1),
                      transition_element(out, j));
  }
}

void Queue::pad_view(const TensorView& dst, const TensorView& src) {
  KCP_CHECK(dst.rank() == src.rank() && dst.rank() <= 4, "pad_view: expected views of one rank <= 4, got dst ",
            shape_str(dst.shape), ", src ", shape_str(src.shape));
  for (int i = 0; i < src.rank(); ++i)
    KCP_CHECK(src.dim(i) <= dst.dim(i), "pad_view: src ", shape_str(src.shape), " does not fit in dst ",
              shape_str(dst.shape));
  fill_zero(dst);
  copy_view(dst.leading(src.shape), src);
}

Queue& host_queue() {
  static HostQueue q;
  return q;
}

DeviceTensor::DeviceTensor(Queue& q, DType dt, Shape shape) {
  const size_t bytes = size_t(shape_numel(shape)) * size_t(dtype_size(dt));
  buf = DeviceBuffer(q, bytes ? bytes : 16);
  view = TensorView(buf.get(), dt, std::move(shape), q.device());
}

const TensorView& DeviceTensor::reuse(Queue& q, DType dt, const Shape& shape) {
  if (!view.data || view.dtype != dt || view.shape != shape || buf.queue() != &q)
    *this = DeviceTensor(q, dt, shape);
  return view;
}

template <class S>
Tensor<S> download_tensor(Queue& q, const TensorView& v) {
  if (v.device == Device::host) return to_tensor<S>(v);
  DeviceTensor packed(q, v.dtype, v.shape);  // contiguous on the device, same dtype
  q.copy_view(packed.view, v);
  std::vector<char> host(size_t(v.numel()) * size_t(dtype_size(v.dtype)));
  q.copy(host.data(), packed.view.data, host.size(), CopyKind::device_to_host);
  q.synchronize();
  return to_tensor<S>(TensorView(host.data(), v.dtype, v.shape));
}
template Tensor<double> download_tensor<double>(Queue&, const TensorView&);
template Tensor<float> download_tensor<float>(Queue&, const TensorView&);

void upload_view(Queue& q, const TensorView& dst, const TensorView& host_src) {
  KCP_CHECK(host_src.device == Device::host, "upload_view: the source must be a host view");
  KCP_CHECK(dst.shape == host_src.shape, "upload_view: shapes differ: dst ", shape_str(dst.shape), ", src ",
            shape_str(host_src.shape));
  std::vector<char> host(size_t(dst.numel()) * size_t(dtype_size(dst.dtype)));
  const TensorView staged(host.data(), dst.dtype, dst.shape);
  host_queue().copy_view(staged, host_src);  // dtype and strides resolved on the host
  if (dst.device == Device::host) return host_queue().copy_view(dst, staged);
  DeviceTensor tmp(q, dst.dtype, dst.shape);
  q.copy(tmp.view.data, host.data(), host.size(), CopyKind::host_to_device);
  q.copy_view(dst, tmp.view);
  q.synchronize();  // `host` is freed on return
}

}  // namespace kcp
