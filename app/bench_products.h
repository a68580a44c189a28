// The matrix products of cpu-chunkwise (delta rule, scalar gate: gdn) alone, at the shapes the
// algorithm runs them (reference/chunkwise*.cpp), with preallocated operands and nothing else: no
// gates, no elementwise work, no loads or stores, no allocation. Their time is a floor under
// cpu-chunkwise on this machine with Eigen's GEMM: the algorithm cannot run faster than its own
// products. `kcp bench-oracle` prints it next to the measured times (docs/CHUNKWISE.md, "Speed").
#pragma once

#include <cstdint>

namespace kcp::app {

struct ProductsTime {
  double fwd = 0, fwd_bwd = 0;  // seconds, best of `repeat`, all heads in parallel over the OpenMP threads
};

// `heads` independent heads of NT chunks of C rows each, K x V states.
template <class S>
ProductsTime chunkwise_products_time(int64_t heads, int64_t NT, int64_t C, int64_t K, int64_t V, int repeat);

}  // namespace kcp::app
