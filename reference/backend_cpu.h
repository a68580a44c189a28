// The CPU backends behind the common interface: "cpu-recurrent" (the token recurrence, the oracle)
// and "cpu-chunkwise" (the chunk/WY algorithm). Both compute in Problem::compute (float64 or
// float32), read inputs of any float dtype and write outputs in the dtype of each output view.
// Covered by tests/reference/test_recurrent.cpp, tests/chunkwise/ and the golden label.
#pragma once

#include <memory>

#include "core/backend.h"

namespace kcp::ref {

enum class CpuAlgorithm { recurrent, chunkwise };

std::unique_ptr<Backend> make_cpu_backend(CpuAlgorithm algorithm);

}  // namespace kcp::ref
