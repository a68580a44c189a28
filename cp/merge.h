// Exchange and merge of the per-rank transitions (ALGORITHMS.md 5.3-5.4, 5.7), written against the
// data communicator and the backend's queue, so the same code runs on host buffers (MPI) and device
// buffers (staged MPI, NCCL). `mine` is this rank's element [1, HV, K, V+K] (core/transition.h) in the
// communicator's memory; `out` receives a state [HV, K, V] on the same device.
//   merge_linear:    FLA's all-gather of every rank's element, then the fold of the ranks
//                    [first, first+count), oldest first (forward) or farthest first (backward, reverse)
//   merge_log_depth: the exclusive prefix of the composition over virtual ranks v = r (forward) or
//                    P-1-r (backward) by Hillis-Steele, ceil(log2 P) rounds of send_recv plus one shift;
//                    the S part of the prefix is the state (elements that start a sequence carry M = 0)
// Both are collective: every rank calls them, also ranks whose out is not needed (out empty).
// Covered by tests/cp/test_cp_mpi.cpp (log-depth vs linear) and the cp-sweep.
#pragma once

#include "core/queue.h"
#include "cp/comm.h"

namespace kcp::cp {

struct MergeTimes {
  double exchange = 0, merge = 0;  // seconds
};

// Device buffers a caller keeps across merges (DeviceTensor::reuse: resized when needed): the
// all-gather of merge_linear, the scan's three elements of merge_log_depth. Null: the merge allocates
// its own for the call.
struct MergeBuffers {
  DeviceTensor gather, x, y, z;
};
MergeTimes merge_linear(Comm& comm, Queue& q, const TensorView& mine, int64_t first, int64_t count, bool reverse,
                        const TensorView& out, MergeBuffers* buffers = nullptr);
MergeTimes merge_log_depth(Comm& comm, Queue& q, const TensorView& mine, bool reverse, const TensorView& out,
                           MergeBuffers* buffers = nullptr);

}  // namespace kcp::cp
