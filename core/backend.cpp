// Small helpers shared by every backend.
#include "core/backend.h"

#include <cstdlib>
#include <cstring>

namespace kcp {

void* Backend::alloc(size_t bytes) {
  void* p = std::malloc(bytes);
  KCP_CHECK(p || !bytes, name(), ": out of host memory allocating ", bytes, " bytes");
  return p;
}
void Backend::release(void* ptr) { std::free(ptr); }
void Backend::upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void Backend::download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void require_support(const Backend& b, const Problem& p) {
  Support s = b.supports(p);
  KCP_CHECK(s.ok, b.name(), " does not support ", p.describe(), ": ", s.reason);
}

}  // namespace kcp
