// Layout helpers of packed transitions (see transition.h).
#include "core/transition.h"

namespace kcp {

TensorView transition_element(const TensorView& packed, int64_t i) {
  KCP_CHECK(packed.rank() == 4 && i >= 0 && i < packed.dim(0), "transition element ", i, " outside a buffer of shape ",
            shape_str(packed.shape));
  TensorView e = packed.narrow(0, i, 1);
  e.shape.erase(e.shape.begin()), e.stride.erase(e.stride.begin());
  return e;
}

TensorView transition_s(const TensorView& e) {
  KCP_CHECK(e.rank() == 3 && e.dim(2) > e.dim(1), "transition element: expected [HV,K,V+K], got ", shape_str(e.shape));
  return e.narrow(2, 0, e.dim(2) - e.dim(1));
}

TensorView transition_m(const TensorView& e) {
  KCP_CHECK(e.rank() == 3 && e.dim(2) > e.dim(1), "transition element: expected [HV,K,V+K], got ", shape_str(e.shape));
  return e.narrow(2, e.dim(2) - e.dim(1), e.dim(1));
}

void check_transition_buffer(const Problem& p, const TensorView& packed, int64_t count, Device device,
                             const char* what, bool allow_s_only) {
  const Shape want = transition_shape(count, p.HV, p.K, p.V);
  const bool s_only = allow_s_only && packed.shape == transition_s_shape(count, p.HV, p.K, p.V);
  KCP_CHECK(packed.shape == want || s_only, what, ": expected a packed transition buffer of shape [count,HV,K,V+K] = ",
            shape_str(want), allow_s_only ? " (or its S part [count,HV,K,V])" : "", ", got ", shape_str(packed.shape));
  KCP_CHECK(packed.contiguous(), what, ": the packed transition buffer must be contiguous");
  KCP_CHECK(packed.dtype == p.compute, what, ": the packed transition buffer must be in the compute precision ",
            dtype_name(p.compute), ", got ", dtype_name(packed.dtype));
  KCP_CHECK(packed.device == device, what, ": the packed transition buffer must live on the backend's device");
}

int64_t check_transition_call(const Problem& p, int64_t seq_begin, const TensorView& packed, Device device,
                              const char* what, bool allow_s_only) {
  KCP_CHECK(packed.rank() == 4, what, ": expected a packed buffer [count,HV,K,V+K], got ", shape_str(packed.shape));
  const int64_t count = packed.dim(0);
  KCP_CHECK(seq_begin >= 0 && count >= 0 && seq_begin + count <= p.N, what, ": sequences [", seq_begin, ", ",
            seq_begin + count, ") outside [0, ", p.N, ")");
  check_transition_buffer(p, packed, count, device, what, allow_s_only);
  return count;
}

TensorView state_entry_kmajor(const TensorView& states, int64_t n, bool v_first) {
  KCP_CHECK(states.rank() == 4 && n >= 0 && n < states.dim(0), "state entry ", n, " outside a view of shape ",
            shape_str(states.shape));
  TensorView e = states.narrow(0, n, 1);
  e.shape.erase(e.shape.begin()), e.stride.erase(e.stride.begin());
  if (v_first) std::swap(e.shape[1], e.shape[2]), std::swap(e.stride[1], e.stride[2]);
  return e;
}

}  // namespace kcp
