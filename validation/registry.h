// Backends by name: "cpu-recurrent", "cpu-chunkwise" and, when built with CUDA, "cuda-chunkwise".
// The only place that knows which backends exist. cuda-chunkwise comes wrapped in the segmented
// forward (intra-card CP, segment/segmented_backend.h): automatic unless KCP_CUDA_SEGMENT or
// BackendOptions::segment says otherwise; a host backend is wrapped only when `segment` is given.
// Outermost, cuda-chunkwise is wrapped in the shape adapter (core/padded_backend.h, cuda::pad_rule()):
// K below 128, V not a multiple of 32 and chunk_size 16 or 32 run zero-padded on the instantiated kernels.
// Covered by tests/validation/test_registry.cpp and test_cli.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "segment/plan.h"

namespace kcp::val {

struct BackendOptions {
  int device = -1;  // device backends: the CUDA ordinal (-1: the current device); ignored by host backends
  // The forward's segment plan (segment/plan.h). Unset: cuda-chunkwise reads KCP_CUDA_SEGMENT
  // (auto | off | <tokens>; unset = auto) and the host backends run unwrapped.
  std::optional<seg::SegmentOptions> segment;
  // cuda-chunkwise: keep the forward's intermediates for the backward that follows on the same inputs
  // (cuda::CudaBackendOptions::keep_forward). Unset: KCP_CUDA_KEEP (1 keep, 0 or unset recompute).
  // The host backends always recompute.
  std::optional<bool> keep_forward;
};

std::vector<std::string> backend_names();  // compiled in
// KCP_CUDA_KEEP as BackendOptions::keep_forward's default; throws on a value other than 0 or 1.
bool keep_forward_from_env();
// What cuda-chunkwise made with opt does: opt.keep_forward, else KCP_CUDA_KEEP (read only then).
bool keep_forward_resolved(const BackendOptions& opt);
// Throws on an unknown name, or when the backend cannot start (e.g. no CUDA device), with the reason.
std::unique_ptr<Backend> backend_create(std::string_view name, const BackendOptions& opt = {});
// Number of CUDA devices this build can use (0 without CUDA or without a device).
int gpu_count();

}  // namespace kcp::val
