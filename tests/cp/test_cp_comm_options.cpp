// The data communicator's options as the programs read them (cp/comm_device.h): `--comm`
// (comm_kind_parse) and KCP_NCCL_SPIN_US (nccl_spin_us_parse, the NCCL wait's polling window), each
// bad value rejected with the option and the value named. Serial, no MPI or GPU needed.
#include <doctest/doctest.h>

#include <string>

#include "core/error.h"
#include "cp/comm_device.h"

using namespace kcp;
using doctest::Contains;

TEST_CASE("--comm: auto, mpi and nccl, anything else named in the error") {
  CHECK(cp::comm_kind_parse("auto") == cp::CommKind::automatic);
  CHECK(cp::comm_kind_parse("mpi") == cp::CommKind::mpi);
  CHECK(cp::comm_kind_parse("nccl") == cp::CommKind::nccl);
  CHECK_THROWS_WITH_AS(cp::comm_kind_parse("NCCL"), Contains("--comm: expected auto, mpi or nccl, got 'NCCL'"), Error);
}

TEST_CASE("KCP_NCCL_SPIN_US: unset or empty is 0, microseconds up to 10^7, bad values named") {
  CHECK(cp::nccl_spin_us_parse(nullptr) == 0);
  CHECK(cp::nccl_spin_us_parse("") == 0);
  CHECK(cp::nccl_spin_us_parse("0") == 0);
  CHECK(cp::nccl_spin_us_parse("500") == 500);
  CHECK(cp::nccl_spin_us_parse("10000000") == 10000000);
  for (const char* bad : {"-1", "500us", "1e3", "x", "10000001", " 5"}) {
    INFO("value '", bad, "'");
    const std::string want =
        std::string("KCP_NCCL_SPIN_US: expected microseconds, an integer in [0, 10000000], got '") + bad + "'";
    CHECK_THROWS_WITH_AS(cp::nccl_spin_us_parse(bad), Contains(want.c_str()), Error);
  }
}
