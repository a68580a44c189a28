// The communicator of the MPI test suites (main_mpi.cpp owns it): every rank runs every test case
// in the same order, so collectives inside a case match up across ranks.
#pragma once

#include "cp/comm.h"

namespace kcp::test {
cp::Comm& world();
}  // namespace kcp::test
