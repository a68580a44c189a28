// launch_fingerprint_add (input_fingerprint.cuh). Each row of the view's last dimension is cut into
// 64-bit words of 8 / es consecutive elements (the last word of a row zero-padded); word j of row r has
// the logical index r * wpr + j (wpr words per row), so a strided view and its contiguous copy agree.
// Contiguous views whose rows are whole words read the words directly (8-byte coalesced loads, four in
// flight per thread); other views gather a word's elements. One mix per word (not per element): the
// mix's 64-bit multiplies, not the memory, bounded the first version (0.65 ms at T = 32768 H = 16 for
// q, k, v; ~1/3 of the H100's bandwidth). A block sums its threads, then one atomicAdd per block.
// The contiguous views of one call share one launch of at most one wave (kMaxBlocks), each thread
// walking view after view: per-view launches left the GPU half idle at T = 8192 (ncu: 2.5 TB/s on q,
// 17% of the stall samples at EXIT, 1.94 waves; docs/BENCHMARKS.md, fifteenth session).
// Covered by tests/cuda/test_cuda_keep.cpp.
#include "cuda/input_fingerprint.cuh"

#include "core/error.h"
#include "cuda/cuda_check.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // about one wave of 256-thread blocks on 132 multiprocessors
constexpr int kMaxWordViews = 8;  // contiguous views per launch

struct FpView {
  const char* p;
  int64_t shape[4], stride[4];  // padded to rank 4 in front (extent 1)
  int64_t cols, wpr, words;     // elements per row, words per row, words in all
  int es;                       // element bytes
};

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t word_hash(int64_t j, uint64_t salt, uint64_t bits) {
  return mix64(uint64_t(j) * 0x9E3779B97F4A7C15ull ^ (salt << 56) ^ bits);
}

// The block's sum into *slot (one atomic per block).
__device__ __forceinline__ void block_add(uint64_t acc, unsigned long long* slot) {
  __shared__ uint64_t part[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += part[w];
    if (s) atomicAdd(slot, static_cast<unsigned long long>(s));
  }
}

// Contiguous views of whole words (the words are the memory itself), one after the other.
struct WordViews {
  const uint64_t* p[kMaxWordViews];
  int64_t words[kMaxWordViews];
  uint64_t salt[kMaxWordViews];
  int n = 0;
};

__global__ void __launch_bounds__(kThreads) fingerprint_words_kernel(WordViews vs, unsigned long long* slot) {
  const int64_t step = int64_t(gridDim.x) * kThreads;
  uint64_t acc = 0;
  for (int i = 0; i < vs.n; ++i) {  // no barrier between views: a thread done with one starts the next
    const uint64_t* w = vs.p[i];
    const int64_t words = vs.words[i];
    const uint64_t salt = vs.salt[i];
    int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    for (; j + 3 * step < words; j += 4 * step) {  // four independent loads in flight
      uint64_t b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) b[u] = __ldg(w + j + u * step);
#pragma unroll
      for (int u = 0; u < 4; ++u) acc += word_hash(j + u * step, salt, b[u]);
    }
    for (; j < words; j += step) acc += word_hash(j, salt, __ldg(w + j));
  }
  block_add(acc, slot);
}

// Any strides: a thread gathers one word's elements.
__global__ void __launch_bounds__(kThreads) fingerprint_gather_kernel(FpView v, uint64_t salt,
                                                                      unsigned long long* slot) {
  const int per = 8 / v.es;
  const int64_t step = int64_t(gridDim.x) * kThreads;
  uint64_t acc = 0;
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < v.words; j += step) {
    const int64_t r = j / v.wpr, c0 = (j % v.wpr) * per;
    const int64_t i2 = r % v.shape[2], i1 = (r / v.shape[2]) % v.shape[1], i0 = r / (v.shape[2] * v.shape[1]);
    const char* row = v.p + (i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2]) * v.es;
    uint64_t bits = 0;
    for (int e = 0; e < per && c0 + e < v.cols; ++e) {
      const char* x = row + (c0 + e) * v.stride[3] * v.es;
      const uint64_t b = v.es == 2 ? *reinterpret_cast<const uint16_t*>(x)
                         : v.es == 4 ? *reinterpret_cast<const uint32_t*>(x)
                                     : *reinterpret_cast<const uint64_t*>(x);
      bits |= b << (8 * v.es * e);
    }
    acc += word_hash(j, salt, bits);
  }
  block_add(acc, slot);
}

// The view's descriptor; false when it has no elements (it adds nothing).
bool fp_view(const TensorView& t, FpView& v) {
  if (t.empty()) return false;
  KCP_CHECK(t.rank() >= 1 && t.rank() <= 4, "fingerprint: expected a view of rank 1..4, got rank ", t.rank());
  v.p = static_cast<const char*>(t.data);
  v.es = int(dtype_size(t.dtype));
  KCP_CHECK(v.es == 2 || v.es == 4 || v.es == 8, "fingerprint: elements of 2, 4 or 8 bytes, got ", v.es);
  const int pad = 4 - int(t.rank());
  for (int d = 0; d < 4; ++d) {
    v.shape[d] = d < pad ? 1 : t.shape[d - pad];
    v.stride[d] = d < pad ? 0 : t.stride[d - pad];
  }
  const int64_t rows = v.shape[0] * v.shape[1] * v.shape[2];
  v.cols = v.shape[3];
  if (rows == 0 || v.cols == 0) return false;  // nothing to add (and no launch of zero blocks)
  const int per = 8 / v.es;
  v.wpr = (v.cols + per - 1) / per;
  v.words = rows * v.wpr;
  return true;
}

int blocks_for(int64_t words) {
  const int64_t want = (words + kThreads - 1) / kThreads;
  return int(want < kMaxBlocks ? want : kMaxBlocks);
}

}  // namespace

void launch_fingerprint_add(std::span<const FingerprintInput> inputs, unsigned long long* slot, cudaStream_t stream) {
  WordViews wv;
  int64_t words = 0;
  auto flush = [&] {
    if (wv.n == 0) return;
    fingerprint_words_kernel<<<blocks_for(words), kThreads, 0, stream>>>(wv, slot);
    KCP_CUDA_LAUNCH_CHECK();
    wv = WordViews{}, words = 0;
  };
  for (const FingerprintInput& in : inputs) {
    FpView v;
    if (!in.t || !fp_view(*in.t, v)) continue;
    const bool direct = in.t->contiguous() && v.cols % (8 / v.es) == 0 && reinterpret_cast<uintptr_t>(v.p) % 8 == 0;
    if (!direct) {  // any strides: a thread gathers one word's elements
      fingerprint_gather_kernel<<<blocks_for(v.words), kThreads, 0, stream>>>(v, in.salt, slot);
      KCP_CUDA_LAUNCH_CHECK();
      continue;
    }
    if (wv.n == kMaxWordViews) flush();
    wv.p[wv.n] = reinterpret_cast<const uint64_t*>(v.p), wv.words[wv.n] = v.words, wv.salt[wv.n] = in.salt;
    ++wv.n, words += v.words;
  }
  flush();
}

void launch_fingerprint_add(const TensorView& t, uint64_t salt, unsigned long long* slot, cudaStream_t stream) {
  const FingerprintInput one{&t, salt};
  launch_fingerprint_add(std::span<const FingerprintInput>(&one, 1), slot, stream);
}

}  // namespace kcp::cuda
