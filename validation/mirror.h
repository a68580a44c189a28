// DeviceMirror: host tensors mirrored on a backend's device for one call, so harness code is written
// once for every backend: inputs are uploaded (converted to a chosen dtype), outputs are zero-filled
// device tensors that download() copies back into their host views. On a host backend every view
// passes through unchanged (no copies). Views are whole tensors or narrowed parts of them.
// Covered by the cp-sweep on cuda-chunkwise (scripts/gpu.sh) and tests/cp/cp_fault_job.cpp.
#pragma once

#include <utility>
#include <vector>

#include "core/backend.h"

namespace kcp::val {

class DeviceMirror {
 public:
  explicit DeviceMirror(Backend& be) : be_(be) {}
  bool on_device() const { return be_.device() != Device::host; }
  // A device copy of `host` in `dt` (host backends: `host` itself). Empty views stay empty.
  TensorView input(const TensorView& host, DType dt);
  // A zeroed device tensor shaped like `host` in its dtype, copied back by download() (host: `host`).
  TensorView output(const TensorView& host);
  // Waits for the queue and copies every output back into its host view.
  void download();

 private:
  Backend& be_;
  std::vector<DeviceTensor> keep_;
  std::vector<std::pair<TensorView, size_t>> outs_;  // host view, index into keep_
};

}  // namespace kcp::val
