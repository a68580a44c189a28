// Affine summaries of a run of tokens and the two ways to merge them across ranks (ALGORITHMS.md
// 5.2-5.4, 5.7). Per value head, a summary (M, S) maps the state entering the run to the state
// leaving it: state_out = M state_in + S, M [K,K], S [K,V]. The backward uses the same algebra on
// (M^T, dS_ext). One rank's summaries are packed as [HV, K, V+K]: columns [0,V) hold S and [V,V+K)
// hold M (FLA's hm / dhm buffer), so one all-gather moves them.
//   compose(later, earlier) = (M_l M_e, M_l S_e + S_l), identity (I, 0), associative
//   fold_linear:   x = 0; for j in order: x = M_j x + S_j        (FLA's all-gather-and-fold, O(P))
//   scan_exclusive: S part of element[v-1] o ... o element[0] over virtual ranks v = r (forward) or
//                  P-1-r (backward), Hillis-Steele: ceil(log2 P) rounds of send_recv, then one shift
// Covered by tests/cp/test_cp_merge.cpp (algebra, serial) and tests/cp/test_cp_mpi.cpp (scan vs fold).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "cp/comm.h"
#include "reference/eigen_types.h"

namespace kcp::cp {

template <class S>
struct Summary {
  int64_t HV = 0, K = 0, V = 0;
  std::vector<S> packed;  // [HV, K, V+K]

  Summary() = default;
  Summary(int64_t hv, int64_t k, int64_t v) : HV(hv), K(k), V(v), packed(size_t(hv * k * (v + k)), S(0)) {}
  static Summary identity(int64_t hv, int64_t k, int64_t v);
  int64_t numel() const { return HV * K * (V + K); }
  Eigen::Map<ref::Mat<S>> head(int64_t hv) { return {packed.data() + hv * K * (V + K), K, V + K}; }
  Eigen::Map<const ref::Mat<S>> head(int64_t hv) const { return {packed.data() + hv * K * (V + K), K, V + K}; }
};

// Applies `earlier` first, then `later`.
template <class S> Summary<S> compose(const Summary<S>& later, const Summary<S>& earlier);

// x = 0; for j in order: x = M_j x + S_j, with element j at gathered + j*HV*K*(V+K). Returns x [HV,K,V].
template <class S>
Tensor<S> fold_linear(const S* gathered, int64_t HV, int64_t K, int64_t V, const std::vector<int>& order);

// The S part [HV,K,V] of the exclusive prefix composition of every rank's `mine` in virtual rank
// order (reverse: virtual rank P-1-r). The first virtual rank gets zeros. Collective.
template <class S> Tensor<S> scan_exclusive(Comm& comm, const Summary<S>& mine, bool reverse);

// The S part of one summary as [HV,K,V].
template <class S> Tensor<S> summary_state(const Summary<S>& a);

}  // namespace kcp::cp
