// Says once, in words ctest recognizes (SKIP_REGULAR_EXPRESSION), that the GPU suite is skipped.
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/cuda/cuda_support.h"

TEST_CASE("CUDA device present") {
  if (!kcp::test::gpu_present()) std::printf("%s\n", kcp::test::kNoGpuMessage);
}
