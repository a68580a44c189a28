// Finite-difference gradient checking for the oracle: perturb every element of every input tensor
// as passed, evaluate L = sum(o * do) + sum(final_state * dht) by central differences, and compare
// with the analytic backward, norm-wise per input (tolerance.h: kFdStep, kFdRel).
#pragma once

#include <string>
#include <vector>

#include "validation/cases.h"

namespace kcp::test {

struct FdResult {
  std::string input;  // "q", "dt_bias", ...
  double rel_err;     // ||fd - analytic|| / ||analytic||
  double norm;        // ||analytic||
};

// Runs the check for every input the case has, with the given backend (default cpu-recurrent).
std::vector<FdResult> fd_check(const val::CaseData& c, const std::string& backend = "cpu-recurrent");

}  // namespace kcp::test
