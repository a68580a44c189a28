// DeviceMirror (see mirror.h).
#include "validation/mirror.h"

namespace kcp::val {

TensorView DeviceMirror::input(const TensorView& host, DType dt) {
  if (!on_device() || host.empty()) return host;
  keep_.emplace_back(be_.queue(), dt, host.shape);
  upload_view(be_.queue(), keep_.back().view, host);
  return keep_.back().view;
}

TensorView DeviceMirror::output(const TensorView& host) {
  if (!on_device() || host.empty()) return host;
  keep_.emplace_back(be_.queue(), host.dtype, host.shape);
  be_.queue().fill_zero(keep_.back().view);
  outs_.emplace_back(host, keep_.size() - 1);
  return keep_.back().view;
}

void DeviceMirror::download() {
  Queue& q = be_.queue();
  q.synchronize();
  for (const auto& [host, i] : outs_) {
    const TensorView& dev = keep_[i].view;  // contiguous, host's dtype
    std::vector<char> bytes(size_t(dev.numel()) * size_t(dtype_size(dev.dtype)));
    q.copy(bytes.data(), dev.data, bytes.size(), CopyKind::device_to_host);
    q.synchronize();
    host_queue().copy_view(host, TensorView(bytes.data(), dev.dtype, dev.shape));
  }
}

}  // namespace kcp::val
