// State entry copies (see state_io.h). Entries are small ([HV,K,V]), so element access through the
// view's strides is fast enough and works for every dtype.
#include "cp/state_io.h"

namespace kcp::cp {
namespace {

int64_t entry_offset(const TensorView& t, int64_t n, int64_t hv, int64_t a, int64_t b) {
  return n * t.stride[0] + hv * t.stride[1] + a * t.stride[2] + b * t.stride[3];
}

void check_entry(const TensorView& t, int64_t n, const char* what) {
  KCP_CHECK(t.rank() == 4 && n >= 0 && n < t.dim(0), what, ": state entry ", n, " outside a view of shape ",
            shape_str(t.shape));
  KCP_CHECK(t.device == Device::host, what, ": the CP layer needs host state views");
}

}  // namespace

void copy_state_entry(const TensorView& dst, int64_t nd, const TensorView& src, int64_t ns) {
  check_entry(dst, nd, "copy_state_entry dst");
  check_entry(src, ns, "copy_state_entry src");
  KCP_CHECK(dst.dim(1) == src.dim(1) && dst.dim(2) == src.dim(2) && dst.dim(3) == src.dim(3),
            "copy_state_entry: entries of shapes ", shape_str(dst.shape), " and ", shape_str(src.shape), " differ");
  for (int64_t hv = 0; hv < dst.dim(1); ++hv)
    for (int64_t a = 0; a < dst.dim(2); ++a)
      for (int64_t b = 0; b < dst.dim(3); ++b)
        dst.set(entry_offset(dst, nd, hv, a, b), src.get(entry_offset(src, ns, hv, a, b)));
}

void zero_state_entry(const TensorView& dst, int64_t n) {
  check_entry(dst, n, "zero_state_entry");
  for (int64_t hv = 0; hv < dst.dim(1); ++hv)
    for (int64_t a = 0; a < dst.dim(2); ++a)
      for (int64_t b = 0; b < dst.dim(3); ++b) dst.set(entry_offset(dst, n, hv, a, b), 0.0);
}

template <class S>
void store_kmajor(const TensorView& dst, int64_t n, const Tensor<S>& x, bool v_first) {
  check_entry(dst, n, "store_kmajor");
  const int64_t HV = x.dim(0), K = x.dim(1), V = x.dim(2);
  KCP_CHECK(dst.dim(1) == HV && dst.dim(2) == (v_first ? V : K) && dst.dim(3) == (v_first ? K : V),
            "store_kmajor: state view ", shape_str(dst.shape), " does not hold [HV,K,V] = ", shape_str(x.shape()));
  for (int64_t hv = 0; hv < HV; ++hv)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t v = 0; v < V; ++v)
        dst.set(v_first ? entry_offset(dst, n, hv, v, k) : entry_offset(dst, n, hv, k, v), double(x(hv, k, v)));
}

template <class S>
Tensor<S> load_kmajor(const TensorView& src, int64_t n, int64_t K, int64_t V, bool v_first) {
  check_entry(src, n, "load_kmajor");
  const int64_t HV = src.dim(1);
  Tensor<S> x({HV, K, V});
  for (int64_t hv = 0; hv < HV; ++hv)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t v = 0; v < V; ++v)
        x(hv, k, v) = S(src.get(v_first ? entry_offset(src, n, hv, v, k) : entry_offset(src, n, hv, k, v)));
  return x;
}

template void store_kmajor<double>(const TensorView&, int64_t, const Tensor<double>&, bool);
template void store_kmajor<float>(const TensorView&, int64_t, const Tensor<float>&, bool);
template Tensor<double> load_kmajor<double>(const TensorView&, int64_t, int64_t, int64_t, bool);
template Tensor<float> load_kmajor<float>(const TensorView&, int64_t, int64_t, int64_t, bool);

}  // namespace kcp::cp
