// backend_create(): the registry of compiled-in backends.
#include "validation/registry.h"

#include <chrono>

#include "reference/backend_cpu.h"
#ifdef KCP_HAS_CUDA_BACKEND
#include "cuda/backend_cuda.h"
#endif

namespace kcp::val {

std::vector<std::string> backend_names() {
  std::vector<std::string> names = {"cpu-recurrent", "cpu-chunkwise"};
#ifdef KCP_HAS_CUDA_BACKEND
  names.push_back("cuda-chunkwise");
#endif
  return names;
}

std::unique_ptr<Backend> backend_create(std::string_view name) {
  if (name == "cpu-recurrent") return ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  if (name == "cpu-chunkwise") return ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
#ifdef KCP_HAS_CUDA_BACKEND
  if (name == "cuda-chunkwise") return cuda::make_cuda_backend();
#endif
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(detail::concat("unknown backend '", name, "' (built: ", known, ")"));
}

}  // namespace kcp::val

namespace kcp::val {

BackendTimer backend_timer(const Backend& b) {
#ifdef KCP_HAS_CUDA_BACKEND
  if (b.name() == "cuda-chunkwise") return cuda::elapsed_ms;
#endif
  (void)b;
  return [](const std::function<void()>& body) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
}

}  // namespace kcp::val
