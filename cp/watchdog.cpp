// The watchdog thread (see watchdog.h): started on the first Watch, it wakes every 200 ms and checks
// the start time of the call in flight. Only one call is in flight per process (the CP layer calls
// its communicator from one thread).
#include "cp/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace kcp::cp {
namespace {

using Clock = std::chrono::steady_clock;

double initial_timeout() {
  const char* e = std::getenv("KCP_CP_TIMEOUT");
  if (!e || !*e) return 600.0;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  return end != e ? v : 600.0;
}

std::atomic<double> g_timeout{initial_timeout()};
std::atomic<const char*> g_what{nullptr};
std::atomic<int64_t> g_since{0};  // Clock ticks at the start of the call in flight

void watch_loop() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const char* what = g_what.load();
    const double limit = g_timeout.load();
    if (!what || limit <= 0) continue;
    const double waited =
        std::chrono::duration<double>(Clock::now().time_since_epoch()).count() -
        std::chrono::duration<double>(Clock::duration(g_since.load())).count();
    if (waited <= limit) continue;
    char msg[256];
    const int n = std::snprintf(msg, sizeof msg,
                                "kcp: %s has waited %.0f s (limit %.0f s, KCP_CP_TIMEOUT): another rank stopped "
                                "answering; ending this rank (pid %d)\n",
                                what, waited, limit, int(getpid()));
    if (n > 0) (void)!write(2, msg, size_t(n));
    std::_Exit(3);
  }
}

void ensure_thread() {
  static std::once_flag once;
  std::call_once(once, [] { std::thread(watch_loop).detach(); });
}

}  // namespace

void set_comm_timeout(double seconds) { g_timeout = seconds; }
double comm_timeout() { return g_timeout.load(); }

Watch::Watch(const char* what) {
  if (g_timeout.load() <= 0) return;
  ensure_thread();
  g_since = Clock::now().time_since_epoch().count();
  g_what = what;
}

Watch::~Watch() { g_what = nullptr; }

}  // namespace kcp::cp
