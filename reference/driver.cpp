// Non-template helpers of driver.h.
#include "reference/driver.h"

namespace kcp::ref {

void check_transition(const Problem& p, int64_t seq, const Transition& tr) {
  KCP_CHECK(seq >= 0 && seq < p.N, "transition: sequence index ", seq, " out of range [0, ", p.N, ")");
  KCP_CHECK(tr.s_ext.shape == (Shape{p.HV, p.K, p.V}), "s_ext: expected shape [HV,K,V] = ",
            shape_str({p.HV, p.K, p.V}), ", got ", shape_str(tr.s_ext.shape));
  KCP_CHECK(tr.m.empty() || tr.m.shape == (Shape{p.HV, p.K, p.K}), "m: expected shape [HV,K,K] = ",
            shape_str({p.HV, p.K, p.K}), ", got ", shape_str(tr.m.shape));
}

template <class S>
void store_head_matrix(const TensorView& t, int64_t hv, const Mat<S>& m) {
  for (int64_t i = 0; i < m.rows(); ++i)
    view_store<S>(t, hv * t.stride[0] + i * t.stride[1], m.cols(), t.stride[2], m.row(i).data());
}

template void store_head_matrix<double>(const TensorView&, int64_t, const Mat<double>&);
template void store_head_matrix<float>(const TensorView&, int64_t, const Mat<float>&);

}  // namespace kcp::ref
