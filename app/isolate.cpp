// run_isolated (see isolate.h): fork, a shared page, waitpid with time limits.
#include "app/isolate.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "io/limits.h"
#include "io/progress.h"

namespace kcp::app {
namespace {

struct Shared {
  volatile int reading;  // 1 while a dump is being read (io/progress.h), 0 after
  int status;
  volatile int done;     // the body returned (or threw): the child did not die inside it
  int64_t pass, warn, fail, skip;
  char where[2048];    // io::note_reading's last object
};

double env_seconds(const char* name, double fallback) {
  const char* e = std::getenv(name);
  const double v = e && *e ? std::atof(e) : 0;
  return v > 0 ? v : fallback;
}

using Body = std::function<int(Tally&, std::string&)>;

int run_body(const std::string& prefix, const Body& body, Tally& t, std::string& payload, std::string& error) {
  try {
    return body(t, payload);
  } catch (const std::exception& e) {
    error = e.what();
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
    return 2;
  }
}

// The file and the object named in the shared page ("x.h5: /inputs/q attribute dtype").
std::pair<std::string, std::string> file_and_object(const Shared& s, const std::string& file_hint) {
  const std::string w(s.where, strnlen(s.where, sizeof s.where));
  const size_t at = w.find(": /");
  if (at != std::string::npos) return {w.substr(0, at), w.substr(at + 2)};
  if (!w.empty()) return {w, "the superblock"};
  return {file_hint, "the file"};
}

std::string signal_name(int sig) {
  const char* n = sigabbrev_np(sig);
  return n ? std::string("SIG") + n : "signal " + std::to_string(sig);
}

}  // namespace

bool isolation_enabled() {
  const char* e = std::getenv("KCP_ISOLATE");
  return !(e && std::strcmp(e, "0") == 0);
}

Isolated run_isolated(const std::string& file, const std::string& prefix, const std::function<int(Tally&)>& body) {
  return run_isolated_payload(file, prefix, [&](Tally& t, std::string&) { return body(t); });
}

Isolated run_isolated_payload(const std::string& file, const std::string& prefix, const Body& body) {
  Isolated r;
  if (!isolation_enabled()) {
    r.status = run_body(prefix, body, r.tally, r.payload, r.error);
    r.printed = !r.error.empty();
    return r;
  }
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {  // no isolation possible: run in-process rather than not at all
    r.status = run_body(prefix, body, r.tally, r.payload, r.error);
    r.printed = !r.error.empty();
    return r;
  }
  std::FILE* payload = std::tmpfile();  // shared offset after fork: the child writes, the parent rewinds
  auto* sh = new (mem) Shared{};
  sh->reading = 1;
  std::fflush(stdout), std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);  // die, and let the parent tell
    io::set_progress_buffer(sh->where, sizeof sh->where, &sh->reading);
#ifndef __SANITIZE_ADDRESS__  // ASan reserves terabytes of address space
    // reading: the memory budget plus 1 GiB for HDF5's own structures, on top of what is mapped
    io::set_read_address_space(size_t(io::memory_limit()) + (size_t(1) << 30));
#endif
    Tally t;
    std::string error, bytes;
    sh->status = run_body(prefix, body, t, bytes, error);
    sh->pass = t.pass, sh->warn = t.warn, sh->fail = t.fail, sh->skip = t.skip;
    if (payload) std::fwrite(bytes.data(), 1, bytes.size(), payload), std::fflush(payload);
    sh->done = 1;
    std::fflush(stdout), std::fflush(stderr);
    _exit(0);
  }
  if (pid < 0) {
    if (payload) std::fclose(payload);
    munmap(mem, sizeof(Shared));
    r.status = run_body(prefix, body, r.tally, r.payload, r.error);
    r.printed = !r.error.empty();
    return r;
  }
  const double read_limit = env_seconds("KCP_READ_TIMEOUT", 120), file_limit = env_seconds("KCP_FILE_TIMEOUT", 3600);
  const auto start = std::chrono::steady_clock::now();
  int wstatus = 0;
  std::string timeout;
  for (int sleep_us = 200; ; sleep_us = std::min(sleep_us * 2, 50000)) {
    if (waitpid(pid, &wstatus, WNOHANG) == pid) break;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool reading = sh->reading == 1;
    if ((reading && s > read_limit) || s > file_limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      timeout = reading ? "reading took more than " + std::to_string(int(read_limit)) + " s (KCP_READ_TIMEOUT)"
                        : "more than " + std::to_string(int(file_limit)) + " s (KCP_FILE_TIMEOUT)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  r.tally.pass = sh->pass, r.tally.warn = sh->warn, r.tally.fail = sh->fail, r.tally.skip = sh->skip;
  if (payload) {
    std::rewind(payload);
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, payload)) > 0;) r.payload.append(buf, n);
    std::fclose(payload);
  }
  const auto [f, object] = file_and_object(*sh, file);
  if (!timeout.empty()) {
    r.status = 2;
    r.error = f + ": " + (sh->reading ? "corrupt HDF5 file? " : "") + timeout + " (at " + object + ")";
  } else if (WIFSIGNALED(wstatus) || !sh->done) {  // a signal, or a sanitizer's exit from its SEGV handler
    const std::string how = WIFSIGNALED(wstatus) ? signal_name(WTERMSIG(wstatus))
                                                 : "exit status " + std::to_string(WEXITSTATUS(wstatus));
    r.status = 2;
    r.error = sh->reading ? f + ": corrupt HDF5 file (" + how + " in the HDF5 library reading " + object + ")"
                          : f + ": kcp crashed (" + how + ") after reading the file (last read: " + object +
                                "); a kcp bug: please report it with the file";
  } else {
    r.status = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 ? sh->status : 2;
    r.printed = r.status == 2;
  }
  if (!r.error.empty() && !r.printed) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), r.error.c_str());
    r.printed = true;
  }
  munmap(mem, sizeof(Shared));
  return r;
}

}  // namespace kcp::app
