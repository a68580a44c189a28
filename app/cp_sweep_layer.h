// The layer rows of `kcp cp-sweep` (app/cp_sweep_layer.cpp): the whole KDA / GDN layer under context
// parallelism (conv halo + kernel state transitions) with the kernel on any backend, host or device,
// against the single-process float64 layer oracle. The layer's other ops are the oracle's own host
// ops (reference/layer.h) in the row's precision; only the kernel runs on the backend.
// Bars, per tensor (out, dx, every weight gradient d<name>):
//   float64: rel_l2 <= tol::kExactF64
//   float32: rel_l2 <= val::float_rule_bar(base, cond), the kernel rows' rule (cp_sweep_run.h), with
//            base = max(rel_l2 of the float32 layer in one process with the cpu-recurrent kernel,
//                       rel_l2 of the float32 layer in one process with the row's backend as kernel)
//            and cond the conditioning of dA_log / ddt_bias (validation/float_rule.h), 1 elsewhere.
// Covered by tests/cp/CMakeLists.txt (cp-sweep at N = 1..4); on the GPU by scripts/gpu.sh.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "app/cp_sweep_cases.h"
#include "app/cp_sweep_run.h"
#include "validation/float_rule.h"
#include "validation/layer_cases.h"

namespace kcp::app {

// The layer sizes a backend's rows use: the small named cases (K = V = 4, chunk 16), or, for a backend
// whose kernel rejects them (cuda-chunkwise: chunk 64, K in {32, 64, 128}, V % 32 == 0), K = V = 32
// and chunk 64. unit: tokens per rank of the layouts (sweep_layouts), not chunk-aligned.
struct LayerGeometry {
  int64_t K, V, C, unit;
  bool operator==(const LayerGeometry&) const = default;
};
LayerGeometry layer_geometry_for(const Backend& backend, bool quick);

// The named layer cases the sweep runs (validation/layer_cases.h) in geometry `geo`, each over every layout.
std::vector<val::LayerCase> layer_cp_cases(uint64_t seed, const LayerGeometry& geo);

using LayerTensors = std::vector<std::pair<std::string, Tensor<double>>>;  // out, dx, d<weight>...

// The single-process results of one case on one layout (computed once for every backend's rows).
struct LayerReference {
  val::LayerCaseData d;          // the case on the layout's packed sequences (no h0, no ht)
  std::vector<int64_t> bounds;   // the partition over the sweep's ranks
  Problem kernel;                // the kernel call inside the layer (float64), for supports()
  LayerTensors oracle;           // float64 oracle (recurrent kernel)
  std::vector<double> base_err;  // per tensor of `oracle`: rel_l2 of the float32 layer (recurrent kernel)
  val::GradConditioning cond;    // of the kernel's gate gradients (dA_log, ddt_bias) inside the layer
};
LayerReference layer_reference(val::LayerCase lc, const SweepLayout& layout, int ranks);

// The float32 baseline of a backend's rows: per tensor, max(ref.base_err, the error of the float32
// layer in one process with `backend` as its kernel). `notes` lists the tensors where the latter
// alone misses the float32 rule (a backend issue, reported, not failed). Needs backend support in float32.
struct LayerBaseline {
  std::vector<double> base;
  std::string notes;
};
LayerBaseline layer_baseline(Backend& backend, const LayerReference& ref);

// One row on the ranks of `comm` (on the backend's memory) in precision dt (f64 or f32).
RowVerdict sweep_layer_row(cp::Comm& comm, Backend& backend, const LayerReference& ref,
                           const std::vector<double>& base, DType dt);

}  // namespace kcp::app
