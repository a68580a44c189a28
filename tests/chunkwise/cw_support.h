// Helpers of the chunkwise suite: run a backend's forward and backward on a seeded case and compare
// every output and gradient of two runs norm-wise (rel_l2 = ||a - b|| / ||b||, validation/compare.h).
#pragma once

#include <string>
#include <vector>

#include "validation/cases.h"

namespace kcp::test {

// o, final state and every gradient of one backend on one case, computed in S.
template <class S>
struct BackendRun {
  val::OutputSet<S> out;
  val::GradSet<S> gr;
};
template <class S> BackendRun<S> run_backend(const std::string& backend, const val::CaseData& c);

struct TensorErr {
  std::string name;  // "o", "final_state", "dq", ...
  double rel = 0;    // rel_l2 of the candidate against the reference
  double ref_norm = 0;
};
// One entry per tensor both runs hold (empty tensors are skipped).
template <class A, class B>
std::vector<TensorErr> compare_runs(const BackendRun<A>& cand, const BackendRun<B>& ref);

}  // namespace kcp::test
