// Communicators on device buffers (cp/comm.h), for a backend whose queue is a device:
//   make_staged_comm(host, queue): MPI through pinned host staging buffers. Each call copies the
//       send buffer to the host on the queue, synchronizes, runs the MPI call, and copies the result
//       back on the queue. Works whatever the number of GPUs (several ranks may share one GPU).
//   make_nccl_comm(host, queue): NCCL on the queue's device and stream, one GPU per rank; the unique
//       id is broadcast over `host`. Each call enqueues the NCCL operation on the stream and waits for
//       it under the communicator watchdog (cp/watchdog.h), so a dead peer ends the job instead of
//       hanging it; a job abort (run_mpi_command) aborts the NCCL communicator first.
// `host` (MPI on host memory) stays the control communicator of both and must outlive them.
// nccl_available() says whether NCCL can be used here (built with nccl.h and libnccl.so.2 loadable at
// run time); make_nccl_comm throws naming the reason otherwise.
// Covered by tests/cp/test_cp_mpi.cpp (staged, on the host queue), tests/cp/test_cp_comm_options.cpp
// (the options' parsing) and, on a GPU machine, by
// `kcp cp-sweep --backend cuda-chunkwise --comm mpi|nccl` (scripts/gpu.sh).
#pragma once

#include <cstdint>
#include <memory>

#include "core/queue.h"
#include "cp/comm.h"

namespace kcp::cp {

std::unique_ptr<Comm> make_staged_comm(Comm& host, Queue& queue);

bool nccl_available();
std::unique_ptr<Comm> make_nccl_comm(Comm& host, Queue& queue);

enum class CommKind { automatic, mpi, nccl };
CommKind comm_kind_parse(std::string_view s);  // "auto", "mpi", "nccl"
// KCP_NCCL_SPIN_US's value (null or empty: 0): the microseconds an NCCL wait polls its stream without
// sleeping before it sleeps 50 us between polls; an integer in [0, 10^7], else throws naming it.
int64_t nccl_spin_us_parse(const char* value);

// The data communicator for a backend on `queue`: host MPI itself (host queue), staged MPI or NCCL.
// automatic: NCCL when the queue is a CUDA device, NCCL is built and every rank of this host has its
// own GPU (local_size() <= gpus); else staged MPI. nccl asked but impossible: throws with the reason.
struct DataComm {
  std::unique_ptr<Comm> owned;  // null when the data communicator is `host` itself
  Comm* comm = nullptr;
  Comm& get() const { return *comm; }
};
DataComm make_data_comm(Comm& host, Queue& queue, CommKind kind, int gpus_on_host);

}  // namespace kcp::cp
