// The causal depthwise conv1d on the GPU (core/conv1d.h; math in reference/conv1d.h, ALGORITHMS.md 5.9):
//   z[t,d] = bias[d] + sum_i w[d,i] x[t-(W-1)+i, d]   (x before a sequence start: the CP halo for the
//            first sequence of the call, else 0);   y = silu(z) or z
//   backward: dz = dy * silu'(z);  dx[p] = sum_i w[i] dz[p+(W-1)-i] over t inside the sequence;
//             dhalo: the same sum at the halo positions; dw[d,i] = sum_t dz[t] x[t-(W-1)+i]; db = sum_t dz
// Tokens are flattened (tt = b*T + t); each token's sequence start/end comes from a device copy of
// cu_seqlens (binary search) or from its batch row. Arithmetic in the compute precision (float32 or
// float64). dw and db are reduced per block of 32 channels over all tokens in a fixed order, so
// results are bitwise reproducible.
// Covered by tests/cuda/test_cuda_conv1d.cpp and the conv rows of `kcp cp-sweep --backend cuda-chunkwise`.
#include "cuda/conv1d.cuh"

#include "cuda/cuda_check.cuh"
#include "cuda/device_math.cuh"

namespace kcp::cuda {
namespace {

struct View2 {  // [TT, D] rows of a [B,T,D] view (B and T merged), or [D,W] / [P,D] / [D]
  const void* p = nullptr;
  int64_t s0 = 0, s1 = 0;
  int dt = kF32;
};
struct OutView2 {
  void* p = nullptr;
  int64_t s0 = 0, s1 = 0;
  int dt = kF32;
};

struct ConvParams {
  int64_t TT = 0, T = 0;
  int D = 0, W = 0, N = 0, halo = 0;
  bool silu = true, varlen = false;
  const int64_t* cu = nullptr;  // [N+1] on the device (varlen)
  View2 x, w, bias, h;          // bias.p / h.p null when absent
};

__device__ __forceinline__ double load2(const void* p, int dt, int64_t i) {
  return dt == kF64 ? static_cast<const double*>(p)[i] : double(load_any(p, dt, i));
}
__device__ __forceinline__ void store2(void* p, int dt, int64_t i, double v) {
  if (dt == kF64) static_cast<double*>(p)[i] = v;
  else store_any(p, dt, i, float(v));
}

// [start, end) of the sequence holding flattened token tt, and whether it is the call's first sequence.
__device__ void sequence_of(const ConvParams& p, int64_t tt, int64_t& start, int64_t& end, bool& first) {
  if (!p.varlen) {
    start = tt / p.T * p.T, end = start + p.T, first = false;  // a dense batch never takes a halo
    return;
  }
  int lo = 0, hi = p.N;  // the last n with cu[n] <= tt and cu[n+1] > tt
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.cu[mid] <= tt) lo = mid;
    else hi = mid;
  }
  while (lo < p.N - 1 && p.cu[lo + 1] <= tt) ++lo;  // skip empty sequences ending at tt
  start = p.cu[lo], end = p.cu[lo + 1], first = lo == 0;
}

// x at flattened position pos of a sequence [start, .): the token, a halo row or zero.
template <class S>
__device__ S x_at(const ConvParams& p, int64_t pos, int64_t start, bool first, int d) {
  if (pos >= start) return S(load2(p.x.p, p.x.dt, pos * p.x.s0 + d * p.x.s1));
  const int64_t back = start - pos;  // 1 .. W-1
  if (!first || back > p.halo) return S(0);
  return S(load2(p.h.p, p.h.dt, (p.halo - back) * p.h.s0 + d * p.h.s1));
}

template <class S>
__device__ S pre_activation(const ConvParams& p, int64_t tt, int64_t start, bool first, int d) {
  S z = p.bias.p ? S(load2(p.bias.p, p.bias.dt, d * p.bias.s0)) : S(0);
  for (int i = 0; i < p.W; ++i)
    z += S(load2(p.w.p, p.w.dt, d * p.w.s0 + i * p.w.s1)) * x_at<S>(p, tt - (p.W - 1) + i, start, first, d);
  return z;
}

template <class S> __device__ S sigmoid_s(S z) { return S(1) / (S(1) + exp(-z)); }

template <class S>
__global__ void conv_forward_kernel(ConvParams p, OutView2 y) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.TT * p.D) return;
  const int64_t tt = idx / p.D;
  const int d = int(idx % p.D);
  int64_t start, end;
  bool first;
  sequence_of(p, tt, start, end, first);
  const S z = pre_activation<S>(p, tt, start, first, d);
  store2(y.p, y.dt, tt * y.s0 + d * y.s1, double(p.silu ? z * sigmoid_s(z) : z));
}

// dz[tt, d] (contiguous [TT, D] in S).
template <class S>
__global__ void conv_dz_kernel(ConvParams p, View2 dy, S* dz) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.TT * p.D) return;
  const int64_t tt = idx / p.D;
  const int d = int(idx % p.D);
  S g = S(load2(dy.p, dy.dt, tt * dy.s0 + d * dy.s1));
  if (p.silu) {
    int64_t start, end;
    bool first;
    sequence_of(p, tt, start, end, first);
    const S z = pre_activation<S>(p, tt, start, first, d), sg = sigmoid_s(z);
    g *= sg * (S(1) + z * (S(1) - sg));
  }
  dz[idx] = g;
}

// dx at position pos: a token, or for the halo a position before the first sequence. Only outputs t
// of the sequence [begin, end) read it: a halo position is read by the first W-1-back tokens alone.
template <class S>
__device__ S dx_at(const ConvParams& p, const S* dz, int64_t pos, int64_t begin, int64_t end, int d) {
  S acc = 0;
  for (int i = 0; i < p.W; ++i) {
    const int64_t t = pos + (p.W - 1) - i;
    if (t < begin || t >= end) continue;
    acc += S(load2(p.w.p, p.w.dt, d * p.w.s0 + i * p.w.s1)) * dz[t * p.D + d];
  }
  return acc;
}

template <class S>
__global__ void conv_dx_kernel(ConvParams p, const S* dz, OutView2 dx, OutView2 dhalo) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx < p.TT * p.D && dx.p) {
    const int64_t tt = idx / p.D;
    const int d = int(idx % p.D);
    int64_t start, end;
    bool first;
    sequence_of(p, tt, start, end, first);
    store2(dx.p, dx.dt, tt * dx.s0 + d * dx.s1, double(dx_at<S>(p, dz, tt, start, end, d)));
  }
  if (idx < int64_t(p.halo) * p.D && dhalo.p) {  // halo row j is position start0 - halo + j
    const int j = int(idx / p.D), d = int(idx % p.D);
    const int64_t start0 = p.varlen ? p.cu[0] : 0, end0 = p.varlen ? p.cu[1] : p.T;  // sequence 0, as the reference
    store2(dhalo.p, dhalo.dt, j * dhalo.s0 + d * dhalo.s1, double(dx_at<S>(p, dz, start0 - p.halo + j, start0, end0, d)));
  }
}

constexpr int kRedCols = 32, kRedRows = 8;

// dw [D,W] and db [D]: block = 32 channels x 8 token rows; fixed-order partial sums, then a fixed tree.
template <class S>
__global__ void conv_dw_kernel(ConvParams p, const S* dz, OutView2 dw, OutView2 db) {
  __shared__ S part[kRedRows][kRedCols][9];  // W <= 8 weights + the bias
  const int c = threadIdx.x % kRedCols, r = threadIdx.x / kRedCols, d = blockIdx.x * kRedCols + c;
  S acc[9] = {};
  if (d < p.D)
    for (int64_t tt = r; tt < p.TT; tt += kRedRows) {
      int64_t start, end;
      bool first;
      sequence_of(p, tt, start, end, first);
      const S g = dz[tt * p.D + d];
      for (int i = 0; i < p.W; ++i) acc[i] += g * x_at<S>(p, tt - (p.W - 1) + i, start, first, d);
      acc[8] += g;
    }
  for (int i = 0; i < 9; ++i) part[r][c][i] = acc[i];
  __syncthreads();
  if (r != 0 || d >= p.D) return;
  for (int i = 0; i < 9; ++i) {
    S sum = 0;
    for (int k = 0; k < kRedRows; ++k) sum += part[k][c][i];
    if (i < p.W && dw.p) store2(dw.p, dw.dt, d * dw.s0 + i * dw.s1, double(sum));
    if (i == 8 && db.p) store2(db.p, db.dt, d * db.s0, double(sum));
  }
}

int code(DType t) {
  switch (t) {
    case DType::f32: return kF32;
    case DType::f16: return kF16;
    case DType::bf16: return kBF16;
    case DType::f64: return kF64;
    default: throw Error(detail::concat("cuda conv1d: float tensors only, got ", dtype_name(t)));
  }
}

// [B,T,D] with B and T merged, or a 2-D / 1-D view as (s0, s1).
View2 view2(const TensorView& t, const char* name) {
  if (t.empty()) return {};
  KCP_CHECK(t.device == Device::cuda, "cuda conv1d: ", name, " must be a CUDA device view");
  if (t.rank() == 3) {
    KCP_CHECK(t.dim(0) == 1 || t.stride[0] == t.dim(1) * t.stride[1], "cuda conv1d: ", name,
              ": batch and time must be mergeable (stride[0] == T*stride[1])");
    return {t.data, t.stride[1], t.stride[2], code(t.dtype)};
  }
  return {t.data, t.stride[0], t.rank() > 1 ? t.stride[1] : 0, code(t.dtype)};
}
OutView2 out2(const TensorView& t, const char* name) {
  const View2 v = view2(t, name);
  return {const_cast<void*>(v.p), v.s0, v.s1, v.dt};
}

unsigned blocks_for(int64_t n) { return unsigned((n + 255) / 256); }

}  // namespace

void conv1d_launch_forward(const Conv1dProblem& pr, const Conv1dTensors& t, const TensorView& y, void* stream_ptr,
                           const int64_t* d_cu) {
  KCP_CHECK(pr.W <= 8, "cuda conv1d: W = ", pr.W, ": the kernels take W <= 8");
  ConvParams p;
  p.TT = pr.B * pr.T, p.T = pr.T, p.D = int(pr.D), p.W = int(pr.W), p.halo = int(pr.halo), p.silu = pr.silu;
  p.varlen = !pr.cu_seqlens.empty(), p.N = p.varlen ? int(pr.cu_seqlens.size()) - 1 : int(pr.B), p.cu = d_cu;
  p.x = view2(t.x, "x"), p.w = view2(t.weight, "weight"), p.bias = view2(t.bias, "bias"), p.h = view2(t.halo, "halo");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (p.TT * p.D == 0) return;
  if (pr.compute == DType::f64) conv_forward_kernel<double><<<blocks_for(p.TT * p.D), 256, 0, stream>>>(p, out2(y, "y"));
  else conv_forward_kernel<float><<<blocks_for(p.TT * p.D), 256, 0, stream>>>(p, out2(y, "y"));
  KCP_CUDA_LAUNCH_CHECK();
}

void conv1d_launch_backward(const Conv1dProblem& pr, const Conv1dTensors& t, const TensorView& dy,
                            const Conv1dGrads& g, void* stream_ptr, const int64_t* d_cu, void* dz_buf) {
  KCP_CHECK(pr.W <= 8, "cuda conv1d: W = ", pr.W, ": the kernels take W <= 8");
  ConvParams p;
  p.TT = pr.B * pr.T, p.T = pr.T, p.D = int(pr.D), p.W = int(pr.W), p.halo = int(pr.halo), p.silu = pr.silu;
  p.varlen = !pr.cu_seqlens.empty(), p.N = p.varlen ? int(pr.cu_seqlens.size()) - 1 : int(pr.B), p.cu = d_cu;
  p.x = view2(t.x, "x"), p.w = view2(t.weight, "weight"), p.bias = view2(t.bias, "bias"), p.h = view2(t.halo, "halo");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const OutView2 dx = out2(g.dx, "dx"), dh = out2(g.dhalo, "dhalo"), dw = out2(g.dweight, "dweight"),
                 db = out2(g.dbias, "dbias");
  const int64_t work = std::max<int64_t>(p.TT, p.halo) * p.D;
  auto run = [&](auto s) {
    using S = decltype(s);
    S* dz = static_cast<S*>(dz_buf);
    if (p.TT * p.D > 0) conv_dz_kernel<S><<<blocks_for(p.TT * p.D), 256, 0, stream>>>(p, view2(dy, "dy"), dz);
    if (work) conv_dx_kernel<S><<<blocks_for(work), 256, 0, stream>>>(p, dz, dx, dh);
    if (p.D) conv_dw_kernel<S><<<unsigned((p.D + kRedCols - 1) / kRedCols), kRedCols * kRedRows, 0, stream>>>(p, dz, dw, db);
    KCP_CUDA_LAUNCH_CHECK();
  };
  if (pr.compute == DType::f64) run(double{});
  else run(float{});
}

}  // namespace kcp::cuda
