// Runs a backend (or the conv1d reference) on the call a dump records and returns its results by
// dataset name: o [B,T,HV,V], final_state [N,HV,K,V], and after backward (when the dump holds do)
// dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias for every input given; for conv1d y, and
// with dy: dx, dweight, dbias. Results are host arrays in the problem's compute dtype.
// Tensors go through the backend's own memory hooks (alloc/upload/download), so a CUDA backend is
// driven exactly like a CPU one: nothing here looks at a backend's name.
// Covered by tests/validation/test_dump_runner.cpp.
#pragma once

#include <map>
#include <string>

#include "core/backend.h"
#include "io/dump_call.h"

namespace kcp::val {

using Results = std::map<std::string, io::Array>;

// When the dump holds do but the backend has no backward for the problem (supports_backward), only
// the forward runs and *backward_skipped (when given) receives the backend's reason.
Results run_op_call(Backend& backend, const io::OpCall& call, std::string* backward_skipped = nullptr);
Results run_conv1d_call(const io::Conv1dCall& call, DType compute);
// Validates a conv1d call as run_conv1d_call would (errors name the file and tensor) and describes it.
std::string describe_conv1d_call(const io::Conv1dCall& call);

// Either of the above for a whole dump: ops run on `backend`, conv1d on the reference.
struct DumpRun {
  Results results;
  std::string group;        // the result group's name: the backend's, or "conv1d-reference"
  std::string description;  // the problem, e.g. "gdn(B=2,T=128,...,float64)"
  DType input_dtype = DType::f32;
  io::Placement placement;
  std::string backward_skipped;  // why the gradients were not computed, when the backend has no backward
};
DumpRun run_dump(Backend& backend, const io::Dump& d, DType compute);

// Results as a dump group: group attributes producer = "kcp", backend, compute; datasets in the
// compute dtype with dtype attributes naming it.
io::DumpGroup results_group(const std::string& name, const Results& r, std::string_view backend, DType compute);

}  // namespace kcp::val
