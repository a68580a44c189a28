// Bounds on what a file may make kcp allocate. Every size that comes from a dump (a dataset's
// declared shape, and sizes derived from it: N from cu_seqlens, states [N,HV,K,V], outputs,
// gradients, workspaces) goes through these overflow-checked products and a memory budget before
// anything is allocated, so a small crafted file can neither wrap a size to a tiny buffer (heap
// overflow) nor ask for more memory than the limit.
//   limit: set_memory_limit(), else env KCP_MAX_MEMORY ("512M", "8G", "1T" or bytes), else half the
//   machine's physical memory (at most 64 GiB). `kcp --max-memory SIZE <command>` sets it.
// Covered by tests/io/test_hostile.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace kcp::io {

int64_t memory_limit();                 // bytes
void set_memory_limit(int64_t bytes);   // <= 0: back to the environment / default
int64_t parse_bytes(const std::string& s, const std::string& what);  // "8G" -> 8 << 30; errors name `what`
std::string bytes_str(double bytes);    // "1.5 GiB"

// a * b, or an Error "<where>: size overflows 63 bits (...)" (both must be >= 0).
int64_t checked_mul(int64_t a, int64_t b, const std::string& where);
// Elements and bytes of a shape, overflow-checked.
int64_t checked_numel(const Shape& s, const std::string& where);
int64_t checked_bytes(const Shape& s, int64_t elem_size, const std::string& where);

// A running total of bytes that must stay under memory_limit(); each add names what it is for.
struct MemoryBudget {
  std::string file;       // the dump the sizes come from
  int64_t used = 0;
  // Throws "<file>: <what> needs <bytes> (<detail>); with what is already planned that is over the
  // memory limit of <limit> (kcp --max-memory or KCP_MAX_MEMORY raise it)".
  void add(const std::string& what, int64_t bytes, const std::string& detail = "");
};

}  // namespace kcp::io
