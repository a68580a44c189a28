// Backends by name: "cpu-recurrent", "cpu-chunkwise" and, when built with CUDA, "cuda-chunkwise".
// The only place that knows which backends exist.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace kcp::val {

struct BackendOptions {
  int device = -1;  // device backends: the CUDA ordinal (-1: the current device); ignored by host backends
};

std::vector<std::string> backend_names();  // compiled in
// Throws on an unknown name, or when the backend cannot start (e.g. no CUDA device), with the reason.
std::unique_ptr<Backend> backend_create(std::string_view name, const BackendOptions& opt = {});
// Number of CUDA devices this build can use (0 without CUDA or without a device).
int gpu_count();

}  // namespace kcp::val
