// Backends by name: "cpu-recurrent", "cpu-chunkwise" and, when built with CUDA, "cuda-chunkwise".
// The only place that knows which backends exist.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace kcp::val {

std::vector<std::string> backend_names();  // compiled in
std::unique_ptr<Backend> backend_create(std::string_view name);  // throws on an unknown name

// Milliseconds that body() takes on a backend's device: CUDA events for a GPU backend (body must
// only enqueue work), the host clock otherwise. Used by `kcp bench`.
using BackendTimer = std::function<double(const std::function<void()>&)>;
BackendTimer backend_timer(const Backend& b);

}  // namespace kcp::val
