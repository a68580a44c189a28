// The correctness gate of `kcp bench`: before a row is timed, the results the timed backend just
// produced (set 0 of the benchmark's inputs) are judged against the float64 oracle under the
// bars the CUDA tests use (validation/float_rule.h device_result_bar: the float32 rule for float32
// inputs, the TF32 / FLA chunk bars for 16-bit inputs), so a wrong fast kernel never reaches the table:
//   err(candidate, oracle) <= device_result_bar(tensor, dtypes, err(float32 recurrence, oracle), cond)
// per tensor, with rel_l2 errors; the oracle is cpu-chunkwise in float64 (equal to the float64 recurrence to
// ~1e-10, tests/reference), the float32 baseline cpu-recurrent in float32, both on the host on the
// same regenerated inputs (bench_inputs.h draws identical values on any backend). Forward: o;
// forward+backward: o and every gradient the row computes (dq, dk, dv, dg, dbeta; with --fused also
// dA_log and ddt_bias).
// Covered by tests/app/test_bench_check.cpp (a correct host candidate passes, a perturbed one fails).
#pragma once

#include <string>

#include "app/bench_inputs.h"

namespace kcp::app {

struct BenchVerdict {
  bool ok = true;
  std::string text;  // "checked: worst o 0.41 of its bar" or "WRONG: dq rel_l2 3e-1 > bar 2e-3"
};

// `p`: the timed problem (its compute dtype is ignored); `o` and `g` (empty for a forward row) are
// the candidate's results on inputs drawn with `seed`, in `be`'s memory.
BenchVerdict check_bench_row(Backend& be, const BenchShape& s, const Problem& p, uint64_t seed, const TensorView& o,
                             const Grads& g);

// The CP transitions of every sequence of `p` ([N, HV, K, V + K] float32 in `be`'s memory: fwd = (S_ext,
// M), bwd = (dS_ext, M^T) with the inputs' d_o) against cpu-chunkwise's in float64, each judged as a
// float32 state ("final_state": kCudaTf32 for 16-bit inputs, the float32 rule for float32 ones).
BenchVerdict check_bench_transitions(Backend& be, const BenchShape& s, const Problem& p, uint64_t seed,
                                     const TensorView& fwd, const TensorView& bwd);

}  // namespace kcp::app
