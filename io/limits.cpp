// Overflow-checked sizes and the memory limit (see limits.h).
#include "io/limits.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace kcp::io {
namespace {

std::atomic<int64_t> g_limit{0};

int64_t default_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t phys = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : int64_t(8) << 30;
  return std::min<int64_t>(phys / 2, int64_t(64) << 30);
}

}  // namespace

int64_t parse_bytes(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string unit = end ? std::string(end) : "";
  if (unit == "K" || unit == "k" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else KCP_CHECK(unit.empty(), what, ": expected a size like 512M, 8G or a byte count, got '", s, "'");
  KCP_CHECK(end != s.c_str() && x > 0 && x * mult < 9.2e18, what, ": expected a positive size, got '", s, "'");
  return int64_t(x * mult);
}

int64_t memory_limit() {
  if (const int64_t l = g_limit.load(); l > 0) return l;
  if (const char* e = std::getenv("KCP_MAX_MEMORY"); e && *e) return parse_bytes(e, "KCP_MAX_MEMORY");
  return default_limit();
}

void set_memory_limit(int64_t bytes) { g_limit.store(bytes); }

std::string bytes_str(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& where) {
  KCP_CHECK(a >= 0 && b >= 0, where, ": negative size (", a, " x ", b, ")");
  int64_t r = 0;
  KCP_CHECK(!__builtin_mul_overflow(a, b, &r), where, ": size overflows 63 bits (", a, " x ", b, ")");
  return r;
}

int64_t checked_numel(const Shape& s, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : s) n = checked_mul(n, d, where + " " + shape_str(s));
  return n;
}

int64_t checked_bytes(const Shape& s, int64_t elem_size, const std::string& where) {
  return checked_mul(checked_numel(s, where), elem_size, where + " " + shape_str(s));
}

void MemoryBudget::add(const std::string& what, int64_t bytes, const std::string& detail) {
  const int64_t limit = memory_limit();
  int64_t total = 0;
  const bool overflow = __builtin_add_overflow(used, bytes, &total);
  KCP_CHECK(!overflow && total <= limit, file, ": ", what, " needs ", bytes_str(double(bytes)),
            detail.empty() ? "" : " (" + detail + ")",
            used ? ", on top of " + bytes_str(double(used)) + " already planned" : std::string(),
            ": over the memory limit of ", bytes_str(double(limit)),
            " (kcp --max-memory SIZE or KCP_MAX_MEMORY raise it)");
  used = total;
}

}  // namespace kcp::io
