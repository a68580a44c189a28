// A 64-bit fingerprint of a tensor's contents, for the kept forward (chunkwise_keep.cu): the backward
// reuses the forward's intermediates only when the inputs it is given still fingerprint the same.
//   F(t) = sum over the 64-bit words w of t of  mix(j_w * 0x9E3779B97F4A7C15 ^ (salt << 56) ^ bits_w)  mod 2^64
// where each row of the last dimension is cut into words of 8 / (element bytes) consecutive elements
// (the row's last word zero-padded), j_w = row * words_per_row + word, and mix = splitmix64's finalizer.
// A sum (order-free: blocks add their partials atomically) of well-mixed 64-bit words: changing any
// element, or the salt (the tensor's role), changes F unless two mixes collide (about 2^-64); the
// words are logical, so a strided view and its contiguous copy fingerprint the same.
// Views of rank 1..4, any strides, elements of 2, 4 or 8 bytes, on the device.
// Covered by tests/cuda/test_cuda_keep.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace kcp::cuda {

// *slot += F(t) (salted), ordered on `stream`; an empty view adds nothing.
void launch_fingerprint_add(const TensorView& t, uint64_t salt, unsigned long long* slot, cudaStream_t stream);

// *slot += the sum of F(t_i) (each salted with its salt_i; a null or empty view adds nothing): the
// contiguous views in one launch, the others gathered one by one. Equal to the single-view calls.
struct FingerprintInput {
  const TensorView* t = nullptr;
  uint64_t salt = 0;
};
void launch_fingerprint_add(std::span<const FingerprintInput> inputs, unsigned long long* slot, cudaStream_t stream);

}  // namespace kcp::cuda
