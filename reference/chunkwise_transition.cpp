// CP primitives of one sequence through the chunk algebra (ALGORITHMS.md 5.2-5.4):
//   forward:  S_ext = the state recurrence from S = 0 (stage chunk_state per chunk),
//             M = M_{NT-1} ... M_1 M_0 with M_c = Diag(Gamma_end) - kg^T w   [K,K]
//   backward: dS_ext = the bwd_dhu loop from dS = 0 at the end (stage chunk_state_backward),
//             m_t = M_0^T M_1^T ... M_{NT-1}^T = M^T, built by the transposed chain last to first.
// The backward needs no state: dv_loc = Aqk^T do and the dS step use only chunk-local pieces, so
// chunks are recomputed on the fly in reverse order. Covered by tests/chunkwise/test_transition.cpp.
#include "reference/chunkwise.h"

namespace kcp::ref {

template <class S>
void chunkwise_transition_forward_head(const Problem& p, const HeadData<S>& d, Mat<S>& s_ext, Mat<S>& m) {
  check_chunkwise_chunk_size(p);
  const int64_t L = d.seq.len, C = p.chunk_size;
  s_ext = Mat<S>::Zero(p.K, p.V);
  m = Mat<S>::Identity(p.K, p.K);
  Mat<S> vnew, s_next;
  for (int64_t c = 0; c < chunk_count(L, C); ++c) {
    const ChunkLocal<S> loc = chunk_local_forward(p, chunk_inputs(d, chunk_span(L, C, c)));
    chunk_state(loc, s_ext, vnew, s_next);
    s_ext.swap(s_next);
    m = chunk_transition_matrix(loc) * m;
  }
}

template <class S>
void chunkwise_transition_backward_head(const Problem& p, const HeadData<S>& d, const Mat<S>& d_o,
                                        Mat<S>& ds_ext, Mat<S>& m_t) {
  check_chunkwise_chunk_size(p);
  const int64_t L = d.seq.len, C = p.chunk_size;
  ds_ext = Mat<S>::Zero(p.K, p.V);
  m_t = Mat<S>::Identity(p.K, p.K);
  Mat<S> dvnew, ds_in;
  for (int64_t c = chunk_count(L, C) - 1; c >= 0; --c) {
    const ChunkSpan s = chunk_span(L, C, c);
    const ChunkLocal<S> loc = chunk_local_forward(p, chunk_inputs(d, s));
    const Mat<S> do_c = d_o.middleRows(s.t0, s.len);
    const Mat<S> dv_loc = loc.Aqk.template triangularView<Eigen::Lower>().transpose() * do_c;
    chunk_state_backward(loc, dv_loc, do_c, ds_ext, S(p.scale), dvnew, ds_in);
    ds_ext.swap(ds_in);
    m_t = chunk_transition_matrix(loc).transpose() * m_t;
  }
}

#define KCP_INSTANTIATE(S)                                                                                \
  template void chunkwise_transition_forward_head<S>(const Problem&, const HeadData<S>&, Mat<S>&, Mat<S>&); \
  template void chunkwise_transition_backward_head<S>(const Problem&, const HeadData<S>&, const Mat<S>&,    \
                                                      Mat<S>&, Mat<S>&);
KCP_INSTANTIATE(double)
KCP_INSTANTIATE(float)
#undef KCP_INSTANTIATE

}  // namespace kcp::ref
