// The TF32 operand conversion of cuda/tile_mma.cuh (tf32_bits, and the split of 3xTF32 products)
// run on the device over host values, for tests (no CUDA headers here). Returns, per input x, the
// bits of hi = tf32(x) and of lo = tf32(x - hi). Covered by tests/cuda/test_cuda_tf32.cpp.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kcp::cuda {

std::pair<std::vector<uint32_t>, std::vector<uint32_t>> tf32_probe(const std::vector<float>& x);

}  // namespace kcp::cuda
