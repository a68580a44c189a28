// doctest main for the MPI suites: MPI is initialized once, every rank runs all cases; rank 0 prints,
// the other ranks print only when one of their checks failed (prefixed with their rank), and the
// exit code is the maximum over ranks, so mpirun and ctest see one verdict. Prints the seed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>

#include "cp/comm_mpi.h"
#include "tests/cp/mpi_world.h"
#include "validation/cases.h"

namespace {
kcp::cp::Comm* g_world = nullptr;
}

kcp::cp::Comm& kcp::test::world() { return *g_world; }

int main(int argc, char** argv) {
  kcp::cp::MpiSession session;
  std::unique_ptr<kcp::cp::Comm> world = kcp::cp::make_mpi_comm();
  g_world = world.get();
  if (world->rank() == 0)
    std::printf("kcp MPI tests: %d ranks, seed %llu (set KCP_SEED to change)\n", world->size(),
                static_cast<unsigned long long>(kcp::val::seed_from_env(0)));
  doctest::Context ctx(argc, argv);
  std::ostringstream quiet;
  if (world->rank() != 0) ctx.setCout(&quiet);
  int rc = ctx.run();
  if (rc && world->rank() != 0) std::fprintf(stderr, "rank %d:\n%s\n", world->rank(), quiet.str().c_str());
  int32_t worst = rc;
  kcp::cp::all_reduce_max(*world, &worst, 1);
  world.reset();
  return worst;
}
