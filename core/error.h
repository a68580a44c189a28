// kcp::Error and KCP_CHECK: every rejected input becomes one exception whose message names the
// argument and what was expected, e.g. "q: expected shape [B,T,H,K] = [1,64,2,32], got [1,64,2]".
// Covered by tests/core/test_problem.cpp.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kcp {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
// Streams any number of values into one string; used by KCP_CHECK.
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kcp

// Throws kcp::Error with the streamed message when cond is false. A macro so that the message is
// only built on failure.
#define KCP_CHECK(cond, ...)                                        \
  do {                                                              \
    if (!(cond)) throw ::kcp::Error(::kcp::detail::concat(__VA_ARGS__)); \
  } while (0)
