// Eigen aliases used across the reference. Token-row matrices ([L,K], [L,V]) and states ([K,V])
// are row-major: a row is one token or one key channel, so the per-row loops of the algorithms
// walk contiguous memory.
#pragma once

#include <Eigen/Dense>

namespace kcp::ref {

template <class S> using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S> using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S> using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

}  // namespace kcp::ref
