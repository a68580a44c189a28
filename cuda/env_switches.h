// The environment switches cuda-chunkwise's pipeline reads when it is created (docs/CUDA.md "Build and
// run"): KCP_CUDA_CHUNK_GRID and KCP_CUDA_KDA_CHAIN (on unless "0"), KCP_CUDA_KDA_WINDOW (auto, off or a
// count of chunks per window). Plain C++, so that the parsing is tested without a GPU
// (tests/cuda/test_cuda_backend.cpp).
#pragma once

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace kcp::cuda {

// A switch that is on unless the environment variable `name` is "0".
inline bool env_not_off(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::string(e) == "0");
}

// KCP_CUDA_KDA_WINDOW's value: null, "" or "auto" -1 (automatic), "0" or "off" 0 (no windows), or a
// count of chunks per window; anything else is an error naming the variable, not a silent default.
inline int window_chunks_setting(const char* e) {
  if (!e || !*e || std::string(e) == "auto") return -1;
  if (std::string(e) == "off") return 0;
  char* end = nullptr;
  const long n = std::strtol(e, &end, 10);
  KCP_CHECK(*end == '\0' && n >= 0 && n <= (1 << 30), "KCP_CUDA_KDA_WINDOW=", e,
            ": expected auto, off, or a count of chunks per window >= 0");
  return int(n);
}
inline int env_window_chunks() { return window_chunks_setting(std::getenv("KCP_CUDA_KDA_WINDOW")); }

}  // namespace kcp::cuda
