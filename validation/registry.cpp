// backend_create(): the registry of compiled-in backends.
#include "validation/registry.h"

#include <cstdlib>

#include "core/padded_backend.h"
#include "reference/backend_cpu.h"
#include "segment/segmented_backend.h"
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

namespace {
std::unique_ptr<Backend> host_backend(ref::CpuAlgorithm a, const BackendOptions& opt) {
  auto be = ref::make_cpu_backend(a);
  return opt.segment ? seg::make_segmented_backend(std::move(be), *opt.segment) : std::move(be);
}
}  // namespace

bool keep_forward_from_env() {
  const char* e = std::getenv("KCP_CUDA_KEEP");
  if (!e || !*e || std::string_view(e) == "0") return false;
  if (std::string_view(e) == "1") return true;
  throw Error(detail::concat("KCP_CUDA_KEEP: expected 1 (keep the forward's intermediates) or 0, got '", e, "'"));
}

bool keep_forward_resolved(const BackendOptions& opt) {
  return opt.keep_forward ? *opt.keep_forward : keep_forward_from_env();
}

std::unique_ptr<Backend> backend_create(std::string_view name, const BackendOptions& opt) {
  if (name == "cpu-recurrent") return host_backend(ref::CpuAlgorithm::recurrent, opt);
  if (name == "cpu-chunkwise") return host_backend(ref::CpuAlgorithm::chunkwise, opt);
#ifdef KCP_HAS_CUDA_BACKEND
  if (name == "cuda-chunkwise") {  // shapes padded outermost: the segmented plan sees the kernels' chunk size
    cuda::CudaBackendOptions bopt;
    bopt.keep_forward = keep_forward_resolved(opt);
    auto split = seg::make_segmented_backend(cuda::make_cuda_backend({opt.device, nullptr}, bopt),
                                             opt.segment ? *opt.segment : seg::segment_options_from_env("KCP_CUDA_SEGMENT"));
    return make_padded_backend(std::move(split), cuda::pad_rule());
  }
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
