// The MPI implementation of Comm (host buffers: float32, float64, int32, int64) and the process-level
// pieces every MPI program of kcp needs: one MPI session per process, and a runner that turns an
// exception on any rank into a job abort carrying that rank's message, so no rank is left waiting
// in a collective. Works as a singleton (size 1) without mpirun.
// Covered by tests/cp/test_cp_mpi.cpp and the fault test (tests/cp/fault_test.sh).
#pragma once

#include <functional>
#include <memory>

#include "cp/comm.h"

namespace kcp::cp {

// Initializes MPI (funneled threads) unless it already is, and finalizes it at the end of scope if
// it initialized it.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_ = false;
};

// A Comm over a duplicate of MPI_COMM_WORLD; MPI must be initialized.
std::unique_ptr<Comm> make_mpi_comm();

// This process's rank among the job's ranks on its host, and their number (MPI_COMM_TYPE_SHARED):
// the GPU a rank uses is its local rank. The first call is collective over MPI_COMM_WORLD (every rank
// must make it; run_mpi_command does); later calls return the cached answer and may be made by any rank.
int local_rank();
int local_size();

// Called (in registration order) before a job abort, e.g. to abort NCCL communicators so no rank is
// left in a device collective. Hooks must not throw.
void on_abort(std::function<void()> hook);

// Runs body(world) inside an MpiSession. An exception on any rank prints "<what>: rank r: <message>"
// and aborts the whole job with exit code 2; otherwise returns body's exit code. When OMP_NUM_THREADS
// is unset, each rank gets max(1, cores / ranks on this host) OpenMP threads.
int run_mpi_command(const char* what, const std::function<int(Comm&)>& body);

}  // namespace kcp::cp
