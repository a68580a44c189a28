// The head sizes the CUDA chunk kernels are instantiated for (dispatch.cuh) and the V tile width,
// shared with the host-only backend code so that supports() states exactly what runs.
#pragma once

namespace kcp::cuda {

inline constexpr int kKeyDims[] = {32, 64, 128};  // K
inline constexpr int kMaxKeyDim = [] {
  int m = 0;
  for (int k : kKeyDims) m = k > m ? k : m;
  return m;
}();
inline constexpr int kValueTile = 32;             // V must be a multiple of this (the state kernel's tile)

inline bool key_dim_supported(long long K) {
  for (int k : kKeyDims)
    if (k == K) return true;
  return false;
}

}  // namespace kcp::cuda
