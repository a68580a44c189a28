// Small helpers shared by every backend.
#include "core/backend.h"

namespace kcp {

void require_support(const Backend& b, const Problem& p) {
  Support s = b.supports(p);
  KCP_CHECK(s.ok, b.name(), " does not support ", p.describe(), ": ", s.reason);
}

void require_backward_support(const Backend& b, const Problem& p) {
  Support s = b.supports_backward(p);
  KCP_CHECK(s.ok, b.name(), " does not support the backward of ", p.describe(), ": ", s.reason);
}

}  // namespace kcp
