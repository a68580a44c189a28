// note_reading (see progress.h).
#include "io/progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace kcp::io {
namespace {
char* g_buffer = nullptr;
size_t g_size = 0;
volatile int* g_reading = nullptr;
size_t g_cap = 0;          // bytes above the current mappings while reading; 0: none
bool g_capped = false;
rlimit g_saved{};

size_t mapped_bytes() {  // the process's current virtual size, from /proc/self/statm (pages)
  unsigned long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return size_t(pages) * size_t(::sysconf(_SC_PAGE_SIZE));
}

void cap_address_space() {
  if (!g_cap || g_capped || getrlimit(RLIMIT_AS, &g_saved) != 0) return;
  rlimit r = g_saved;
  const rlim_t want = rlim_t(mapped_bytes() + g_cap);
  if (r.rlim_max != RLIM_INFINITY && want > r.rlim_max) return;
  if (r.rlim_cur != RLIM_INFINITY && want >= r.rlim_cur) return;  // already tighter
  r.rlim_cur = want;
  g_capped = setrlimit(RLIMIT_AS, &r) == 0;
}

void uncap_address_space() {
  if (g_capped && setrlimit(RLIMIT_AS, &g_saved) == 0) g_capped = false;
}
}  // namespace

void set_read_address_space(size_t bytes) { g_cap = bytes; }

void set_progress_buffer(char* buffer, size_t size, volatile int* reading) {
  g_buffer = buffer, g_size = buffer ? size : 0, g_reading = buffer ? reading : nullptr;
}

void note_done_reading() {
  if (g_reading) *g_reading = 0;
  uncap_address_space();
}

void note_reading(const std::string& where) {
  if (g_reading) *g_reading = 1;
  cap_address_space();
  if (!g_buffer || g_size == 0) return;
  const size_t n = std::min(where.size(), g_size - 1);
  std::memcpy(g_buffer, where.data(), n);
  g_buffer[n] = '\0';
}

}  // namespace kcp::io
