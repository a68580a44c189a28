// Summary algebra, the linear fold and the Hillis-Steele scan (formulas in merge.h).
#include "cp/merge.h"

namespace kcp::cp {

using ref::Mat;

template <class S>
Summary<S> Summary<S>::identity(int64_t hv, int64_t k, int64_t v) {
  Summary a(hv, k, v);
  for (int64_t h = 0; h < hv; ++h) a.head(h).rightCols(k).setIdentity();
  return a;
}

template <class S>
Summary<S> compose(const Summary<S>& later, const Summary<S>& earlier) {
  KCP_CHECK(later.HV == earlier.HV && later.K == earlier.K && later.V == earlier.V,
            "compose: summaries of different shapes");
  const int64_t K = later.K, V = later.V;
  Summary<S> r(later.HV, K, V);
  for (int64_t h = 0; h < later.HV; ++h) {
    const auto l = later.head(h), e = earlier.head(h);
    auto out = r.head(h);
    out.rightCols(K).noalias() = l.rightCols(K) * e.rightCols(K);
    out.leftCols(V).noalias() = l.rightCols(K) * e.leftCols(V);
    out.leftCols(V) += l.leftCols(V);
  }
  return r;
}

template <class S>
Tensor<S> fold_linear(const S* gathered, int64_t HV, int64_t K, int64_t V, const std::vector<int>& order) {
  Tensor<S> x({HV, K, V});
  const int64_t per_rank = HV * K * (V + K);
  for (int64_t h = 0; h < HV; ++h) {
    Eigen::Map<Mat<S>> xh(x.data() + h * K * V, K, V);
    for (int j : order) {
      const Eigen::Map<const Mat<S>> a(gathered + j * per_rank + h * K * (V + K), K, V + K);
      xh = (a.rightCols(K) * xh + a.leftCols(V)).eval();
    }
  }
  return x;
}

template <class S>
Tensor<S> summary_state(const Summary<S>& a) {
  Tensor<S> x({a.HV, a.K, a.V});
  for (int64_t h = 0; h < a.HV; ++h) Eigen::Map<Mat<S>>(x.data() + h * a.K * a.V, a.K, a.V) = a.head(h).leftCols(a.V);
  return x;
}

template <class S>
Tensor<S> scan_exclusive(Comm& comm, const Summary<S>& mine, bool reverse) {
  const int P = comm.size();
  const int v = reverse ? P - 1 - comm.rank() : comm.rank();
  auto rank_at = [&](int u) { return u < 0 || u >= P ? kNoRank : (reverse ? P - 1 - u : u); };
  Summary<S> x = mine;
  int tag = 0x5ca0;
  // after the round with distance d, x covers virtual ranks [max(0, v-2d+1), v]
  for (int d = 1; d < P; d *= 2, ++tag) {
    Summary<S> y(mine.HV, mine.K, mine.V);
    comm.send_recv(x.packed.data(), rank_at(v + d), y.packed.data(), rank_at(v - d), x.numel(), dtype_of<S>(), tag);
    if (v - d >= 0) x = compose(x, y);
  }
  // exclusive: take the inclusive prefix of virtual rank v-1
  Summary<S> prev(mine.HV, mine.K, mine.V);
  comm.send_recv(x.packed.data(), rank_at(v + 1), prev.packed.data(), rank_at(v - 1), x.numel(), dtype_of<S>(), tag);
  return summary_state(prev);
}

#define KCP_INSTANTIATE(S)                                                                         \
  template struct Summary<S>;                                                                      \
  template Summary<S> compose<S>(const Summary<S>&, const Summary<S>&);                            \
  template Tensor<S> fold_linear<S>(const S*, int64_t, int64_t, int64_t, const std::vector<int>&); \
  template Tensor<S> summary_state<S>(const Summary<S>&);                                          \
  template Tensor<S> scan_exclusive<S>(Comm&, const Summary<S>&, bool);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::cp
