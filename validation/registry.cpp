// backend_create(): the registry of compiled-in backends.
#include "validation/registry.h"

#include "reference/backend_cpu.h"

namespace kcp::val {

std::vector<std::string> backend_names() { return {"cpu-recurrent", "cpu-chunkwise"}; }

std::unique_ptr<Backend> backend_create(std::string_view name) {
  if (name == "cpu-recurrent") return ref::make_cpu_backend(ref::CpuAlgorithm::recurrent);
  if (name == "cpu-chunkwise") return ref::make_cpu_backend(ref::CpuAlgorithm::chunkwise);
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(detail::concat("unknown backend '", name, "' (built: ", known, ")"));
}

}  // namespace kcp::val
