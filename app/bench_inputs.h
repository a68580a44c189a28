// Benchmark inputs generated where they are used: a token range [t0, t0+T) of a global problem whose
// values are a function of (seed, tensor, global element index) (nccl-tests' regenerable inputs), so
// a CP rank draws exactly its slice of the same global problem without ever holding the rest.
//   q, k: normal, L2-normalized per row; v, do: normal; g: U(-0.3, -0.001) log decay (per head, or per
//   channel for kda/gla); beta: U(0, 1). q/k/v/do in `qkv` (bf16, f16 or f32), g and beta float32.
// Placed on the backend's device (its queue). Used by `kcp bench` and `kcp cp-bench`.
#pragma once

#include <vector>

#include "core/backend.h"

namespace kcp::app {

struct BenchShape {
  Variant variant = Variant::gdn;
  int64_t H = 16, K = 128, V = 128;  // H = HV
  DType qkv = DType::bf16;
};

struct BenchInputs {
  std::vector<DeviceBuffer> buffers;
  Inputs in;        // q, k, v, g, beta (beta empty for gla) as [1, T, ...]
  TensorView d_o;   // [1, T, H, V]
};

BenchInputs make_bench_inputs(Backend& be, const BenchShape& s, int64_t t0, int64_t T, uint64_t seed,
                              bool with_do = false);

}  // namespace kcp::app
