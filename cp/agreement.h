// Before any computation, every rank hashes its view of the call (sizes, flags, cu_seqlens, bounds,
// which tensors are present) and the ranks all-gather (hash, local error flag): a rank whose own
// validation failed throws its message, the others throw naming that rank, and a hash that differs
// from rank 0's makes every rank throw the same error. All ranks leave through the same exception,
// so none is left waiting in a later collective.
// Covered by tests/cp/test_cp_mpi.cpp ("ranks that disagree ...").
#pragma once

#include <cstdint>
#include <string>

#include "core/queue.h"
#include "cp/comm.h"

namespace kcp::cp {

int64_t config_hash(const std::string& config);  // FNV-1a, identical on every rank and machine
// A hash of a view's values (widened to float64, in index order; strides and dtype do not matter;
// a device view is read through `q`), for parameters every rank must hold identically (A_log,
// dt_bias, conv weights). "-" if absent.
std::string content_hash(Queue& q, const TensorView& t);

// Collective. `what` names the call in messages ("cp forward"); `local_error` is empty when this
// rank's validation passed.
void agree_on_config(Comm& comm, const char* what, const std::string& config, const std::string& local_error);

}  // namespace kcp::cp
