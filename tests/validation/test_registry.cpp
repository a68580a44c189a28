// The backend registry (validation/registry.h): the names built in, an unknown name's error, and
// KCP_CUDA_KEEP, the default of BackendOptions::keep_forward (1 keep, 0 or unset recompute, anything
// else an error naming the variable).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "validation/registry.h"

using namespace kcp;

namespace {
// Sets (or, with null, unsets) KCP_CUDA_KEEP for one scope and restores it after.
struct KeepEnv {
  std::string old;
  bool had;
  explicit KeepEnv(const char* v) : had(std::getenv("KCP_CUDA_KEEP") != nullptr) {
    if (had) old = std::getenv("KCP_CUDA_KEEP");
    if (v) setenv("KCP_CUDA_KEEP", v, 1);
    else unsetenv("KCP_CUDA_KEEP");
  }
  ~KeepEnv() {
    if (had) setenv("KCP_CUDA_KEEP", old.c_str(), 1);
    else unsetenv("KCP_CUDA_KEEP");
  }
};
}  // namespace

TEST_CASE("registry: the CPU backends are built in; an unknown name lists the built ones") {
  const auto names = val::backend_names();
  REQUIRE(names.size() >= 2);
  CHECK(names[0] == "cpu-recurrent");
  CHECK(names[1] == "cpu-chunkwise");
  try {
    val::backend_create("cpu-nonexistent");
    FAIL("an unknown backend was created");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("unknown backend 'cpu-nonexistent'") != std::string::npos);
    CHECK(m.find("cpu-chunkwise") != std::string::npos);
  }
}

TEST_CASE("registry: KCP_CUDA_KEEP is 1 (keep), 0 or unset (recompute), else an error naming it") {
  {
    KeepEnv e(nullptr);
    CHECK_FALSE(val::keep_forward_from_env());
  }
  {
    KeepEnv e("0");
    CHECK_FALSE(val::keep_forward_from_env());
  }
  {
    KeepEnv e("1");
    CHECK(val::keep_forward_from_env());
  }
  for (const char* bad : {"yes", "2", "true"}) {
    KeepEnv e(bad);
    CAPTURE(bad);
    try {
      val::keep_forward_from_env();
      FAIL("KCP_CUDA_KEEP accepted a bad value");
    } catch (const Error& x) {
      CHECK(std::string(x.what()).find("KCP_CUDA_KEEP") != std::string::npos);
      CHECK(std::string(x.what()).find(bad) != std::string::npos);
    }
  }
}
