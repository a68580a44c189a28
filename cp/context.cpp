// build_cp_context(): partition validation and the per-rank fields (see context.h).
#include "cp/context.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace kcp::cp {
namespace {

void check_cu_seqlens(const std::vector<int64_t>& cu) {
  KCP_CHECK(cu.size() >= 2, "cu_seqlens: expected at least 2 entries [0, ..., T], got ", cu.size());
  KCP_CHECK(cu.front() == 0, "cu_seqlens: must start at 0, got ", cu.front());
  for (size_t i = 1; i < cu.size(); ++i)
    KCP_CHECK(cu[i] >= cu[i - 1], "cu_seqlens: must be nondecreasing, but entry ", i, " = ", cu[i], " < entry ",
              i - 1, " = ", cu[i - 1]);
}

void check_bounds(const std::vector<int64_t>& bounds, int64_t total) {
  KCP_CHECK(bounds.size() >= 2, "cp bounds: expected P+1 >= 2 entries, got ", bounds.size());
  KCP_CHECK(bounds.front() == 0, "cp bounds: must start at 0, got ", bounds.front());
  for (size_t i = 1; i < bounds.size(); ++i)
    KCP_CHECK(bounds[i] >= bounds[i - 1], "cp bounds: must be nondecreasing, but R[", i, "] = ", bounds[i],
              " < R[", i - 1, "] = ", bounds[i - 1]);
  KCP_CHECK(bounds.back() == total, "cp bounds: the parts cover ", bounds.back(),
            " tokens but cu_seqlens ends at T = ", total);
}

// Whether sequence n belongs to `rank`: its tokens meet the rank's part, or it is empty and owned here.
bool is_local(const std::vector<int64_t>& cu, const std::vector<int64_t>& bounds, int rank, size_t n) {
  const int64_t a = cu[n], b = cu[n + 1], lo = bounds[size_t(rank)], hi = bounds[size_t(rank) + 1], T = bounds.back();
  if (a < b) return a < hi && b > lo;
  return rank_of_token(bounds, std::min(a, T - 1)) == rank;
}

}  // namespace

std::vector<int64_t> equal_bounds(int64_t total, int P) {
  KCP_CHECK(P >= 1, "cp: rank count must be positive, got ", P);
  KCP_CHECK(total >= 0, "cp: token count must be nonnegative, got ", total);
  std::vector<int64_t> r(size_t(P) + 1, 0);
  const int64_t part = total / P, extra = total % P;
  for (int64_t i = 1; i <= P; ++i) r[size_t(i)] = r[size_t(i) - 1] + part + (i - 1 < extra ? 1 : 0);
  return r;
}

int rank_of_token(const std::vector<int64_t>& bounds, int64_t t) {
  KCP_CHECK(t >= 0 && t < bounds.back(), "cp: token ", t, " outside [0, ", bounds.back(), ")");
  // the last r with R[r] <= t: empty parts before a nonempty one are skipped
  return int(std::upper_bound(bounds.begin(), bounds.end(), t) - bounds.begin()) - 1;
}

CpContext build_cp_context(const std::vector<int64_t>& cu, const std::vector<int64_t>& bounds, int rank) {
  check_cu_seqlens(cu);
  const int64_t T = cu.back();
  KCP_CHECK(T > 0, "cp: the packed token stream is empty (cu_seqlens ends at 0); nothing to split");
  check_bounds(bounds, T);
  const int P = int(bounds.size()) - 1;
  KCP_CHECK(rank >= 0 && rank < P, "cp: rank ", rank, " outside [0, ", P, ")");
  CpContext c;
  c.rank = rank, c.size = P, c.bounds = bounds;
  c.lo = bounds[size_t(rank)], c.hi = bounds[size_t(rank) + 1];
  c.local_cu = {0};
  if (c.empty()) return c;  // no sequences, identity contribution, flags stay true
  const size_t N = cu.size() - 1;
  size_t n = 0;
  while (!is_local(cu, bounds, rank, n)) ++n;
  c.seq_begin = int64_t(n);
  for (; n < N && is_local(cu, bounds, rank, n); ++n) c.local_cu.push_back(std::min(cu[n + 1], c.hi) - c.lo);
  c.seq_end = int64_t(n);
  for (; n < N; ++n)  // local sequences must be one contiguous run of ids
    KCP_CHECK(!is_local(cu, bounds, rank, n), "cp: internal error, local sequences of rank ", rank, " not contiguous");
  const int64_t first_start = cu[size_t(c.seq_begin)], last_end = cu[size_t(c.seq_end)];
  c.is_first_rank = first_start >= c.lo;
  c.is_last_rank = last_end <= c.hi;
  c.pre_num_ranks = c.is_first_rank ? 0 : rank - rank_of_token(bounds, first_start);
  c.post_num_ranks = c.is_last_rank ? 0 : rank_of_token(bounds, last_end - 1) - rank;
  c.pre_num_conv_tokens = std::max<int64_t>(0, c.lo - first_start);
  return c;
}

std::string CpContext::describe() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << size << " [" << lo << "," << hi << ") seqs [" << seq_begin << "," << seq_end
     << ") local_cu [";
  for (size_t i = 0; i < local_cu.size(); ++i) os << (i ? "," : "") << local_cu[i];
  os << "] pre " << pre_num_ranks << " post " << post_num_ranks << " conv " << pre_num_conv_tokens;
  return os.str();
}

}  // namespace kcp::cp
