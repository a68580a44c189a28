// One row of the cp-sweep: run a case through the CP layer (or the CP conv1d) on every rank,
// assemble the global tensors (token parts and owned state entries are zero elsewhere, so a sum over
// ranks is exact), and judge each tensor against the single-process float64 oracle:
//   float64: rel_l2(CP, oracle) <= tol::kExactF64
//   float32: rel_l2(CP, oracle) <= val::float_rule_bar(rel_l2(float32 baseline, oracle), cond, device) (validation/float_rule.h;
//            the floor of the backend's device: 3xTF32 products on the CUDA device, tolerance.h kSplitTf32FloorFactor)
// where the baseline error is that of the single-process cpu-recurrent (or reference conv1d) in
// float32, or of the CP row's own backend run in one process in float32 when that is larger: the
// sweep judges what CP adds; a backend that misses the rule on its own is reported by
// sweep_backend_notes() (and judged by its own suite), not failed here.
// Parameter gradients must also be bitwise identical on every rank.
// Covered by running the sweep (tests/cp/CMakeLists.txt).
#pragma once

#include "validation/float_rule.h"

#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "cp/comm.h"
#include "cp/context_parallel.h"
#include "app/cp_sweep_cases.h"
#include "validation/cases.h"

namespace kcp::app {

using cp::Comm;
using cp::MergeAlgorithm;

using NamedViews = std::vector<std::pair<std::string, TensorView>>;

// Single-process results of one case: the float64 oracle and the float32 baseline's errors.
struct SweepReference {
  val::OutputSet<double> out;
  val::GradSet<double> grads;
  std::vector<double> base_err;  // per tensor of named(), rel_l2(float32 baseline, oracle)
  val::GradConditioning cond;    // conditioning of dg / dA_log / ddt_bias for the float32 rule's floor
  NamedViews named() const;
};
SweepReference sweep_reference(const val::CaseData& c, Backend& oracle);

struct RowVerdict {
  bool pass = true;
  double worst_ratio = 0;  // max over tensors of err / bar
  std::string errors;      // "o 1.2e-16 ht 3.0e-16 ..."
  std::string failure;     // the first failing tensor and where, when !pass
};

// The CP result of a case, assembled on every rank into single-process shapes; params_agree says
// whether dA_log and ddt_bias came out bitwise identical on every rank. `comm` works on the backend's
// memory (its control() communicator assembles the host results); inputs are staged on the device
// in the compute precision for device backends.
template <class S>
struct CpCaseResult {
  val::OutputSet<S> out;
  val::GradSet<S> grads;
  bool params_agree = true;
  NamedViews named() const;
};
// earlier: a case of the same problem whose inputs the same ContextParallel runs first (its results
// dropped), so that what the object keeps between calls is exercised.
template <class S>
CpCaseResult<S> run_cp_case(Comm& comm, Backend& backend, const val::CaseData& c, const std::vector<int64_t>& bounds,
                            MergeAlgorithm merge, bool backward = true, const val::CaseData* earlier = nullptr);

// rel_l2 against the oracle of `backend` run in one process in float32, per tensor of named() (the
// forward's tensors only when the backend has no backward for the case).
std::vector<double> sweep_single_errors(Backend& backend, const val::CaseData& c, const SweepReference& ref);
// "dA_log 6.7e-06 > rule 5.4e-06" for each tensor where `single` misses the float32 rule of `device`; empty if none.
std::string sweep_backend_notes(const SweepReference& ref, const std::vector<double>& single, Device device);

// base_err: per tensor of named(), the float32 baseline error the row's bar is built from.
RowVerdict sweep_cp_row(Comm& comm, Backend& backend, const val::CaseData& c, const SweepReference& ref,
                        const std::vector<double>& base_err, const SweepLayout& layout, MergeAlgorithm merge,
                        DType compute);

RowVerdict sweep_conv_row(Comm& comm, Backend& backend, const SweepLayout& layout, int64_t W, bool silu_bias,
                          DType compute, uint64_t seed);

}  // namespace kcp::app
