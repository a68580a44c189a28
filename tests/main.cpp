// doctest main shared by the serial suites: prints the seed every suite starts from (KCP_SEED
// overrides it) so a failure can be rerun exactly.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "validation/cases.h"

int main(int argc, char** argv) {
  std::printf("kcp tests: seed %llu (set KCP_SEED to change)\n",
              static_cast<unsigned long long>(kcp::val::seed_from_env(0)));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
