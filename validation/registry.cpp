// backend_create(): the registry of compiled-in backends.
#include "validation/registry.h"

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

std::unique_ptr<Backend> backend_create(std::string_view name, const BackendOptions& opt) {
  (void)opt;  // the host backends take no options
  if (name == "cpu-recurrent") return ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  if (name == "cpu-chunkwise") return ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
#ifdef KCP_HAS_CUDA_BACKEND
  if (name == "cuda-chunkwise") return cuda::make_cuda_backend({opt.device, nullptr});
#endif
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(detail::concat("unknown backend '", name, "' (built: ", known, ")"));
}

}  // namespace kcp::val

namespace kcp::val {

int gpu_count() {
#ifdef KCP_HAS_CUDA_BACKEND
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace kcp::val
