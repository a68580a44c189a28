// Reading untrusted dumps in a child process. The HDF5 library is not hardened against corrupt
// files: a damaged heap or chunk index can make it crash (SIGSEGV in H5HG_read, H5VM_memcpyvv) or
// spin. The kcp programs therefore run each file's work in a fork()ed child:
//   - the child notes what it reads (io/progress.h) in a page shared with the parent, and reports
//     its Tally (check's pass/warn/fail/skip) there;
//   - a signal while reading becomes "FILE: corrupt HDF5 file (SIGSEGV reading /inputs/q)", exit 2
//     for that file, and the next file is still checked; a signal later is reported as a kcp crash;
//   - reading has a time limit (KCP_READ_TIMEOUT seconds, default 120), the whole file another
//     (KCP_FILE_TIMEOUT, default 3600); the child is killed when either passes.
// KCP_ISOLATE=0 runs everything in-process (debuggers). The library API (io/dump.h) stays in-process.
// Covered by tests/validation/test_isolate.cpp and tests/validation/test_cli.cpp.
#pragma once

#include <functional>
#include <string>

#include "app/report.h"

namespace kcp::app {

struct Isolated {
  int status = 0;        // the body's return value, or 2 when it threw or died
  Tally tally;           // what the body put in its Tally
  std::string error;     // the one-line error (already printed by the child, or the parent's message)
  bool printed = false;  // the child printed `error` itself
  std::string payload;   // what the body put in its payload (run_isolated_payload)
};

bool isolation_enabled();  // KCP_ISOLATE != "0"

// Runs body(tally) in a child process (in-process when isolation is off). `file` names the dump in
// the parent's messages. Exceptions in the body become status 2 with their message printed to
// stderr as "<prefix>: error: <message>".
Isolated run_isolated(const std::string& file, const std::string& prefix, const std::function<int(Tally&)>& body);
// The same, and the bytes the body leaves in `payload` (kcp check: the file's JSON record) come back
// to the parent through an unlinked temporary file (empty when the child died before writing them).
Isolated run_isolated_payload(const std::string& file, const std::string& prefix,
                              const std::function<int(Tally&, std::string&)>& body);

}  // namespace kcp::app
