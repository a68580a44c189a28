// The layer rows of `kcp cp-sweep` (app/cp_sweep_layer.cpp): the whole KDA / GDN layer under context
// parallelism (conv halo + kernel state transitions) on a CPU backend against the float64 layer oracle.
// Covered by tests/cp/CMakeLists.txt (cp-sweep at N = 1..4).
#pragma once

#include <vector>

#include "app/cp_sweep_cases.h"
#include "app/cp_sweep_run.h"
#include "validation/layer_cases.h"

namespace kcp::app {

// The named layer cases the sweep runs (validation/layer_cases.h), each over every layout.
std::vector<val::LayerCase> layer_cp_cases(uint64_t seed);
// One row: `lc` on the layout's packed sequences and partition, precision dt (f64 or f32).
RowVerdict sweep_layer_row(cp::Comm& comm, Backend& backend, const SweepLayout& layout, val::LayerCase lc, DType dt);

}  // namespace kcp::app
