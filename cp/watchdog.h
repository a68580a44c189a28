// A watchdog for blocking communication: a rank that stops answering (stopped with SIGSTOP, hung in
// a driver, deadlocked) would leave every other rank waiting in a collective forever. Each
// communicator call runs under a Watch; a background thread ends the process with a message naming
// the call and the time waited when one call lasts longer than the limit, and the MPI launcher
// then ends the other ranks.
//   limit: KCP_CP_TIMEOUT seconds (default 600; 0 disables), or set_timeout() (cp-sweep --timeout)
// Covered by tests/cp/watchdog_test.sh (a rank stops itself; the job must end within the limit + 5 s).
#pragma once

namespace kcp::cp {

// Seconds a single communicator call may block before the process is ended; <= 0: no limit.
void set_comm_timeout(double seconds);
double comm_timeout();

// Marks one blocking call (`what` must be a string literal: it is read by the watchdog thread).
class Watch {
 public:
  explicit Watch(const char* what);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
};

}  // namespace kcp::cp
