// Kernels of the CUDA queue (see queue_ops.cuh). The view kernels move values through double, which
// holds every float32/float16/bfloat16/float64 value exactly, and round once on the store (as the
// host queue does). The transition kernels compute in the buffer's precision with plain FMAs: the CP
// chain must not round M or S to 16 bits (ALGORITHMS.md 5.6), and these products are tiny
// ([HV, K, V+K] per rank or segment) next to the chunk kernels.
#include "cuda/queue_ops.cuh"

#include <algorithm>
#include <vector>

#include "core/transition.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_math.cuh"

namespace kcp::cuda {
namespace {

struct Strided4 {  // a rank <= 4 view padded to rank 4 on the left
  void* p;
  int dt;
  int64_t n[4], s[4];
};

int code_of(DType t, const char* what) {
  switch (t) {
    case DType::f32: return kF32;
    case DType::f16: return kF16;
    case DType::bf16: return kBF16;
    case DType::f64: return kF64;
    default: throw Error(detail::concat(what, ": float views only, got ", dtype_name(t)));
  }
}

Strided4 strided4(const TensorView& v, const char* what) {
  KCP_CHECK(v.rank() <= 4, what, ": views of rank <= 4, got ", v.rank());
  KCP_CHECK(v.device == Device::cuda, what, ": the view must live on the CUDA device");
  Strided4 r{v.data, code_of(v.dtype, what), {1, 1, 1, 1}, {0, 0, 0, 0}};
  const int pad = 4 - v.rank();
  for (int i = 0; i < v.rank(); ++i) r.n[pad + i] = v.shape[size_t(i)], r.s[pad + i] = v.stride[size_t(i)];
  return r;
}

__device__ double load_d(const void* p, int dt, int64_t i) {
  switch (dt) {
    case kF16: return double(__half2float(static_cast<const __half*>(p)[i]));
    case kBF16: return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case kF64: return static_cast<const double*>(p)[i];
    default: return double(static_cast<const float*>(p)[i]);
  }
}

__device__ void store_d(void* p, int dt, int64_t i, double x) {
  switch (dt) {
    case kF16: static_cast<__half*>(p)[i] = __double2half(x); break;
    case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(x); break;
    case kF64: static_cast<double*>(p)[i] = x; break;
    default: static_cast<float*>(p)[i] = float(x); break;
  }
}

__device__ __forceinline__ int64_t offset_of(const Strided4& v, int64_t flat) {
  int64_t off = 0;
  for (int d = 3; d >= 0; --d) {
    off += (flat % v.n[d]) * v.s[d];
    flat /= v.n[d];
  }
  return off;
}

__global__ void view_op_kernel(ViewOp op, Strided4 dst, Strided4 src, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = offset_of(dst, i);
    if (op == ViewOp::zero) {
      store_d(dst.p, dst.dt, d, 0.0);
      continue;
    }
    const double x = load_d(src.p, src.dt, offset_of(src, i));
    store_d(dst.p, dst.dt, d, op == ViewOp::add ? load_d(dst.p, dst.dt, d) + x : x);
  }
}

// dst = src zero-extended: one pass over dst's index space; an element inside src's extent on every
// axis is copied, the rest written 0 (the padding of the shape adapter, core/padded_backend.h).
__global__ void pad_kernel(Strided4 dst, Strided4 src, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t d_off = 0, s_off = 0, flat = i;
    bool inside = true;
    for (int d = 3; d >= 0; --d) {
      const int64_t x = flat % dst.n[d];
      flat /= dst.n[d];
      d_off += x * dst.s[d], s_off += x * src.s[d];
      inside = inside && x < src.n[d];
    }
    store_d(dst.p, dst.dt, d_off, inside ? load_d(src.p, src.dt, s_off) : 0.0);
  }
}

// A [HV, K, X] block of a packed element (row stride and head stride in elements).
template <class S>
struct Mats {
  S* p;
  int64_t sh, sr;
  __device__ S& at(int h, int r, int c) const { return p[h * sh + r * sr + c]; }
};
template <class S> Mats<S> mats(const TensorView& v) { return {static_cast<S*>(v.data), v.stride[0], v.stride[1]}; }

// The fold's and the scan's blocks (one per head and 32-column slice: HV * V/32 of them, 64 at HV = 16)
// walk a chain of dependent steps: 512 threads (K/16 rows each) keep more of each step's K x K x 32
// FMAs in flight.
constexpr int kThreads = 512, kCols = 32;

// One step of a transition chain for one (head, 32-column slice of S): x = M_e x + S_e, with x and
// the next x in shared memory [K][32]; `step_out` (rows of V elements, may be null) receives the new x.
// e is the element's head [K, V+K]: S then M. Rows are spread over the block's kThreads threads.
template <class S>
__device__ void chain_step(const S* e, S* x, S* xn, S* step_out, int K, int V, int c0) {
  const int c = threadIdx.x % kCols, r0 = threadIdx.x / kCols;
  constexpr int kRowStep = kThreads / kCols;
  const bool col_ok = c0 + c < V;
  const int64_t row = V + K;
  for (int i = r0; i < K; i += kRowStep) {
    S acc = col_ok ? e[i * row + c0 + c] : S(0);
    for (int q = 0; q < K; ++q) acc = fma(e[i * row + V + q], x[q * kCols + c], acc);
    xn[i * kCols + c] = acc;
    if (step_out && col_ok) step_out[int64_t(i) * V + c0 + c] = acc;
  }
  __syncthreads();
  for (int i = r0; i < K; i += kRowStep) x[i * kCols + c] = xn[i * kCols + c];
  __syncthreads();
}

// One block per (head, 32-column slice of S): x [K][32] in shared memory, stepped through the range.
template <class S>
__global__ void __launch_bounds__(kThreads) fold_kernel(const S* elems, int64_t elem_stride, int64_t first,
                                                        int64_t count, int reverse, Mats<S> x0, bool has_x0,
                                                        Mats<S> out, int K, int V) {
  extern __shared__ unsigned char smem_raw[];
  S* x = reinterpret_cast<S*>(smem_raw);
  S* xn = x + K * kCols;
  const int h = blockIdx.x, c0 = kCols * blockIdx.y, c = threadIdx.x % kCols, r0 = threadIdx.x / kCols;
  constexpr int kRowStep = kThreads / kCols;
  const bool col_ok = c0 + c < V;
  const int64_t head = int64_t(K) * (V + K);
  for (int i = r0; i < K; i += kRowStep) x[i * kCols + c] = has_x0 && col_ok ? x0.at(h, i, c0 + c) : S(0);
  __syncthreads();
  for (int64_t step = 0; step < count; ++step) {
    const int64_t j = reverse ? first + count - 1 - step : first + step;
    chain_step<S>(elems + j * elem_stride + h * head, x, xn, nullptr, K, V, c0);
  }
  if (col_ok)
    for (int i = r0; i < K; i += kRowStep) out.at(h, i, c0 + c) = x[i * kCols + c];
}

// Ranges of one scan launch (a kernel parameter: blockIdx.z picks one); its steps are a dependent
// chain (one per segment), on kThreads like the fold's.
constexpr int kScanBatch = 64;
struct ScanRanges {
  int64_t first[kScanBatch], count[kScanBatch];
};

// One block per (head, 32-column slice, range): from x = 0 through the range, the state after each
// element written to out [E, HV, K, V] (contiguous) at that element's index.
template <class S>
__global__ void __launch_bounds__(kThreads) scan_kernel(const S* elems, int64_t elem_stride, ScanRanges r, S* out,
                                                        int K, int V) {
  extern __shared__ unsigned char smem_raw[];
  S* x = reinterpret_cast<S*>(smem_raw);
  S* xn = x + K * kCols;
  const int h = blockIdx.x, HV = gridDim.x, c0 = kCols * blockIdx.y, c = threadIdx.x % kCols, r0 = threadIdx.x / kCols;
  constexpr int kRowStep = kThreads / kCols;
  const int64_t head = int64_t(K) * (V + K), first = r.first[blockIdx.z], count = r.count[blockIdx.z];
  for (int i = r0; i < K; i += kRowStep) x[i * kCols + c] = S(0);
  __syncthreads();
  for (int64_t j = first; j < first + count; ++j)
    chain_step<S>(elems + j * elem_stride + h * head, x, xn, out + (j * HV + h) * int64_t(K) * V, K, V,
                                c0);
}

// out[h][i][c] = sum_q A[h][i][q] B[h][q][c] (+ C[h][i][c]) for c < N; one thread per output.
template <class S>
__global__ void head_product_kernel(Mats<S> a, Mats<S> b, Mats<S> c, bool add_c, Mats<S> out, int K, int N) {
  const int h = blockIdx.y, idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= K * N) return;
  const int i = idx / N, col = idx % N;
  S acc = add_c ? c.at(h, i, col) : S(0);
  for (int q = 0; q < K; ++q) acc = fma(a.at(h, i, q), b.at(h, q, col), acc);
  out.at(h, i, col) = acc;
}

// M part of each head: identity (diag = 1) or zero; S part zeroed when `zero_s`.
template <class S>
__global__ void set_m_kernel(Mats<S> t, int K, int V, bool identity, bool zero_s) {
  const int h = blockIdx.y, idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= K * (V + K)) return;
  const int i = idx / (V + K), col = idx % (V + K);
  if (col >= V) t.at(h, i, col) = identity && col - V == i ? S(1) : S(0);
  else if (zero_s) t.at(h, i, col) = S(0);
}

template <class S>
void head_product(const TensorView& a, const TensorView& b, const TensorView* c, const TensorView& out,
                  cudaStream_t stream) {
  const int HV = int(out.dim(0)), K = int(a.dim(1)), N = int(out.dim(2));
  if (HV == 0 || K * N == 0) return;
  const Mats<S> cm = c ? mats<S>(*c) : Mats<S>{nullptr, 0, 0};
  head_product_kernel<S><<<dim3(unsigned((K * N + 255) / 256), unsigned(HV)), 256, 0, stream>>>(
      mats<S>(a), mats<S>(b), cm, c != nullptr, mats<S>(out), K, N);
  KCP_CUDA_LAUNCH_CHECK();
}

template <class S>
void set_m(const TensorView& t, bool identity, bool zero_s, cudaStream_t stream) {
  const int HV = int(t.dim(0)), K = int(t.dim(1)), V = int(t.dim(2)) - K;
  if (HV == 0) return;
  set_m_kernel<S><<<dim3(unsigned((K * (V + K) + 255) / 256), unsigned(HV)), 256, 0, stream>>>(mats<S>(t), K, V,
                                                                                               identity, zero_s);
  KCP_CUDA_LAUNCH_CHECK();
}

template <class F>
void by_precision(const TensorView& t, const char* what, F f) {
  KCP_CHECK(t.device == Device::cuda, what, ": the transition buffer must live on the CUDA device");
  KCP_CHECK(t.dtype == DType::f32 || t.dtype == DType::f64, what, ": transitions are float32 or float64, got ",
            dtype_name(t.dtype));
  KCP_CHECK(t.stride.back() == 1, what, ": the last dimension must be contiguous");
  if (t.dtype == DType::f64) f(double{});
  else f(float{});
}

}  // namespace

void launch_view_op(ViewOp op, const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  const char* what = op == ViewOp::copy ? "copy_view" : op == ViewOp::add ? "add_view" : "fill_zero";
  const Strided4 d = strided4(dst, what);
  const Strided4 s = op == ViewOp::zero ? d : strided4(src, what);
  KCP_CHECK(op == ViewOp::zero || dst.shape == src.shape, what, ": shapes differ: dst ", shape_str(dst.shape), ", src ",
            shape_str(src.shape));
  const int64_t total = dst.numel();
  if (total == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 4096));
  view_op_kernel<<<blocks, 256, 0, stream>>>(op, d, s, total);
  KCP_CUDA_LAUNCH_CHECK();
}

void launch_pad_view(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  const Strided4 d = strided4(dst, "pad_view"), s = strided4(src, "pad_view");
  KCP_CHECK(dst.rank() == src.rank(), "pad_view: ranks differ: dst ", shape_str(dst.shape), ", src ", shape_str(src.shape));
  for (int i = 0; i < 4; ++i)
    KCP_CHECK(s.n[i] <= d.n[i], "pad_view: src ", shape_str(src.shape), " does not fit in dst ", shape_str(dst.shape));
  const int64_t total = dst.numel();
  if (total == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 4096));
  pad_kernel<<<blocks, 256, 0, stream>>>(d, s, total);
  KCP_CUDA_LAUNCH_CHECK();
}

void launch_transition_fold(const TensorView& elems, int64_t first, int64_t count, bool reverse, const TensorView& x0,
                            const TensorView& out, cudaStream_t stream) {
  by_precision(elems, "transition_fold", [&](auto s) {
    using S = decltype(s);
    KCP_CHECK(elems.rank() == 4 && elems.contiguous(), "transition_fold: elems must be a contiguous [P,HV,K,V+K] buffer");
    const int HV = int(elems.dim(1)), K = int(elems.dim(2)), V = int(elems.dim(3)) - K;
    KCP_CHECK(out.shape == Shape({HV, K, V}) && out.dtype == elems.dtype && out.stride.back() == 1,
              "transition_fold: out must be [HV,K,V] = ", shape_str({HV, K, V}), " in the elements' dtype");
    KCP_CHECK(x0.empty() || (x0.shape == out.shape && x0.dtype == elems.dtype && x0.stride.back() == 1),
              "transition_fold: x0 must be [HV,K,V] like out");
    KCP_CHECK(first >= 0 && count >= 0 && first + count <= elems.dim(0), "transition_fold: range [", first, ", ",
              first + count, ") outside [0, ", elems.dim(0), ")");
    if (HV == 0 || V == 0) return;
    const size_t smem = sizeof(S) * 2 * size_t(K) * kCols;
    launch_kernel(fold_kernel<S>, dim3(unsigned(HV), unsigned((V + kCols - 1) / kCols)), kThreads, smem, stream,
                  static_cast<const S*>(elems.data), elems.stride[0], first, count, int(reverse),
                  x0.empty() ? Mats<S>{nullptr, 0, 0} : mats<S>(x0), !x0.empty(), mats<S>(out), K, V);
  });
}

void launch_transition_scan(const TensorView& elems, const std::vector<TransitionRange>& ranges, const TensorView& out,
                            cudaStream_t stream) {
  by_precision(elems, "transition_scan", [&](auto s) {
    using S = decltype(s);
    KCP_CHECK(elems.rank() == 4 && elems.contiguous(), "transition_scan: elems must be a contiguous [E,HV,K,V+K] buffer");
    const int64_t E = elems.dim(0);
    const int HV = int(elems.dim(1)), K = int(elems.dim(2)), V = int(elems.dim(3)) - K;
    KCP_CHECK(out.shape == Shape({E, HV, K, V}) && out.dtype == elems.dtype && out.contiguous() &&
                  out.device == Device::cuda,
              "transition_scan: out must be a contiguous [E,HV,K,V] = ", shape_str({E, HV, K, V}),
              " device buffer in the elements' dtype, got ", shape_str(out.shape));
    std::vector<TransitionRange> sorted = ranges;
    std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < sorted.size(); ++i) {
      const TransitionRange& r = sorted[i];
      KCP_CHECK(r.first >= 0 && r.count >= 0 && r.first + r.count <= E, "transition_scan: range [", r.first, ", ",
                r.first + r.count, ") outside [0, ", E, ")");
      KCP_CHECK(i == 0 || sorted[i - 1].first + sorted[i - 1].count <= r.first, "transition_scan: ranges overlap at ",
                r.first);
    }
    if (HV == 0 || V == 0) return;
    const size_t smem = sizeof(S) * 2 * size_t(K) * kCols;
    for (size_t b = 0; b < ranges.size(); b += kScanBatch) {
      ScanRanges sr{};
      const int n = int(std::min<size_t>(kScanBatch, ranges.size() - b));
      for (int i = 0; i < n; ++i) sr.first[i] = ranges[b + size_t(i)].first, sr.count[i] = ranges[b + size_t(i)].count;
      launch_kernel(scan_kernel<S>, dim3(unsigned(HV), unsigned((V + kCols - 1) / kCols), unsigned(n)), kThreads, smem,
                    stream, static_cast<const S*>(elems.data), elems.stride[0], sr, static_cast<S*>(out.data), K, V);
    }
  });
}

void launch_transition_compose(const TensorView& later, const TensorView& earlier, const TensorView& out,
                               cudaStream_t stream) {
  by_precision(later, "transition_compose", [&](auto s) {
    using S = decltype(s);
    KCP_CHECK(earlier.shape == later.shape && out.shape == later.shape && earlier.dtype == later.dtype &&
                  out.dtype == later.dtype,
              "transition_compose: later, earlier and out must share shape and dtype");
    const TensorView ls = transition_s(later);
    head_product<S>(transition_m(later), transition_s(earlier), &ls, transition_s(out), stream);
    head_product<S>(transition_m(later), transition_m(earlier), nullptr, transition_m(out), stream);
  });
}

void launch_transition_start(const TensorView& t, const TensorView& x0, cudaStream_t stream) {
  by_precision(t, "transition_start", [&](auto s) {
    using S = decltype(s);
    if (!x0.empty()) {  // S += M x0 in place: each output reads only its own S element
      KCP_CHECK(x0.shape == transition_s(t).shape && x0.dtype == t.dtype && x0.stride.back() == 1,
                "transition_start: x0 must be [HV,K,V] in the transition's dtype");
      const TensorView ts = transition_s(t);
      head_product<S>(transition_m(t), x0, &ts, ts, stream);
    }
    set_m<S>(t, false, false, stream);
  });
}

void launch_transition_identity(const TensorView& t, cudaStream_t stream) {
  by_precision(t, "transition_identity", [&](auto s) { set_m<decltype(s)>(t, true, true, stream); });
}

}  // namespace kcp::cuda
