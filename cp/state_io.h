// Moving per-sequence states between the global state views of a CP call ([N,HV,K,V], or [N,HV,V,K]
// with state_v_first, any float dtype, host) and the CP layer's own buffers: whole entries copied
// layout to layout, and K-major [HV,K,V] matrices (what transitions and merges produce) stored into
// or loaded from an entry in either layout.
// Covered through tests/cp/test_cp_merge.cpp and the cp-sweep (state_v_first rows).
#pragma once

#include "core/tensor.h"

namespace kcp::cp {

// dst[nd] = src[ns] (same shape per entry, any dtypes and strides).
void copy_state_entry(const TensorView& dst, int64_t nd, const TensorView& src, int64_t ns);
// dst[n] = 0.
void zero_state_entry(const TensorView& dst, int64_t n);
// dst[n] = x (x is K-major [HV,K,V]; transposed when v_first).
template <class S> void store_kmajor(const TensorView& dst, int64_t n, const Tensor<S>& x, bool v_first);
// The K-major [HV,K,V] matrix of src[n].
template <class S> Tensor<S> load_kmajor(const TensorView& src, int64_t n, int64_t K, int64_t V, bool v_first);

}  // namespace kcp::cp
