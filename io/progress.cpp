// note_reading (see progress.h).
#include "io/progress.h"

#include <algorithm>
#include <cstring>

namespace kcp::io {
namespace {
char* g_buffer = nullptr;
size_t g_size = 0;
volatile int* g_reading = nullptr;
}  // namespace

void set_progress_buffer(char* buffer, size_t size, volatile int* reading) {
  g_buffer = buffer, g_size = buffer ? size : 0, g_reading = buffer ? reading : nullptr;
}

void note_done_reading() {
  if (g_reading) *g_reading = 0;
}

void note_reading(const std::string& where) {
  if (g_reading) *g_reading = 1;
  if (!g_buffer || g_size == 0) return;
  const size_t n = std::min(where.size(), g_size - 1);
  std::memcpy(g_buffer, where.data(), n);
  g_buffer[n] = '\0';
}

}  // namespace kcp::io
