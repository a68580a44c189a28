// agree_on_config(): one all-gather of (hash, error flag) per rank (see agreement.h).
#include "cp/agreement.h"

#include <vector>

#include "core/error.h"

namespace kcp::cp {

int64_t config_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return int64_t(h);
}

std::string content_hash(Queue& q, const TensorView& t) {
  if (t.empty()) return "-";
  const Tensor<double> x = download_tensor<double>(q, t);
  const std::string bytes(reinterpret_cast<const char*>(x.data()), size_t(x.numel()) * sizeof(double));
  return std::to_string(config_hash(bytes));
}

void agree_on_config(Comm& comm, const char* what, const std::string& config, const std::string& local_error) {
  const int P = comm.size();
  const int64_t mine[2] = {config_hash(config), local_error.empty() ? 0 : 1};
  std::vector<int64_t> all(size_t(2 * P));
  all_gather(comm, mine, all.data(), 2);
  KCP_CHECK(local_error.empty(), local_error);
  for (int r = 0; r < P; ++r)
    KCP_CHECK(!all[size_t(2 * r + 1)], what, ": rank ", r, " rejected its input (its message names the argument); ",
              "no computation was started");
  for (int r = 0; r < P; ++r)
    KCP_CHECK(all[size_t(2 * r)] == all[0], what, ": ranks disagree on the configuration (rank ", r,
              "'s hash differs from rank 0's): every rank must pass the same sizes, flags, states, cu_seqlens, "
              "bounds, backend and merge; rank ", comm.rank(), " has: ", config);
}

}  // namespace kcp::cp
