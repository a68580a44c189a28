// app/isolate.h: a body in a child process. A signal while reading becomes "FILE: corrupt HDF5 file
// (SIGSEGV in the HDF5 library reading /inputs/q)", status 2; a hang is killed at the read limit; a
// thrown error is printed once; the Tally comes back; a crash after reading is called a kcp bug.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "app/isolate.h"
#include "core/error.h"
#include "io/progress.h"

using namespace kcp;

TEST_CASE("run_isolated: tally, errors, signals while reading and after, read time limit") {
  REQUIRE(app::isolation_enabled());
  const app::Isolated ok = app::run_isolated("x.h5", "kcp test", [](app::Tally& t) {
    t.pass = 3, t.fail = 1;
    return 1;
  });
  CHECK(ok.status == 1);
  CHECK(ok.tally.pass == 3);
  CHECK(ok.tally.fail == 1);
  CHECK(ok.error.empty());

  const app::Isolated err = app::run_isolated("x.h5", "kcp test", [](app::Tally&) -> int {
    throw Error("x.h5: /inputs/q: missing");
  });
  CHECK(err.status == 2);
  CHECK(err.printed);

  const app::Isolated segv = app::run_isolated("x.h5", "kcp test", [](app::Tally&) {
    io::note_reading("x.h5: /inputs/q attribute dtype");
    raise(SIGSEGV);
    return 0;
  });
  CHECK(segv.status == 2);
  CHECK(segv.error == "x.h5: corrupt HDF5 file (SIGSEGV in the HDF5 library reading /inputs/q attribute dtype)");

  const app::Isolated late = app::run_isolated("x.h5", "kcp test", [](app::Tally&) {
    io::note_reading("x.h5: /inputs/q");
    io::note_done_reading();
    abort();
    return 0;
  });
  CHECK(late.status == 2);
  CHECK(late.error.find("x.h5: kcp crashed (SIGABRT) after reading the file") == 0);

  setenv("KCP_READ_TIMEOUT", "1", 1);
  const app::Isolated hang = app::run_isolated("x.h5", "kcp test", [](app::Tally&) {
    io::note_reading("x.h5: /inputs/v");
    for (;;) pause();
    return 0;
  });
  unsetenv("KCP_READ_TIMEOUT");
  CHECK(hang.status == 2);
  CHECK(hang.error.find("x.h5: corrupt HDF5 file? reading took more than 1 s (KCP_READ_TIMEOUT) (at /inputs/v)") == 0);
}
