// Benchmark inputs generated where they are used: a token range [t0, t0+T) of a global problem whose
// values are a function of (seed, tensor, global element index) (nccl-tests' regenerable inputs), so
// a CP rank draws exactly its slice of the same global problem without ever holding the rest.
//   q, k: normal, L2-normalized per row; v, do: normal; g: U(-0.3, -0.001) log decay (per head, or per
//   channel for kda/gla); beta: U(0, 1). q/k/v/do in `qkv` (bf16, f16 or f32), g and beta float32.
//   fused (gdn, kda: the input transforms inside the kernels, Kimi Linear's KDA call): q, k normal
//   (normalized by the kernel), beta: normal logits (sigmoid in the kernel), g: U(-1, 1) raw gate with
//   A_log [HV] U(-1, 0) and dt_bias ([HV], kda [HV*K]) U(-4, -3), so that the softplus gate
//   -exp(A_log) softplus(g + dt_bias) lies in about [-0.13, -0.003] per token.
// Placed on the backend's device (its queue). Used by `kcp bench` and `kcp cp-bench`.
#pragma once

#include <vector>

#include "core/backend.h"

namespace kcp::app {

struct BenchShape {
  Variant variant = Variant::gdn;
  int64_t H = 16, K = 128, V = 128;  // H = HV
  DType qkv = DType::bf16;
  bool fused = false;  // L2 norm, beta sigmoid and the softplus gate in the kernel (gdn, kda)
  Flags flags() const;  // the Problem flags of these inputs
};

struct BenchInputs {
  std::vector<DeviceBuffer> buffers;
  Inputs in;        // q, k, v, g, beta (beta empty for gla) as [1, T, ...]; fused: also A_log, dt_bias
  TensorView d_o;   // [1, T, H, V]
};

BenchInputs make_bench_inputs(Backend& be, const BenchShape& s, int64_t t0, int64_t T, uint64_t seed,
                              bool with_do = false);

}  // namespace kcp::app
