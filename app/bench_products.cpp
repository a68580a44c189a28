// The product list of cpu-chunkwise (gdn) per chunk, run alone (see bench_products.h). Each line
// below names the stage in reference/chunkwise*.cpp it mirrors and uses the same Eigen expression
// (triangular views included), so the floor has the algorithm's shapes and FLOPs.
#include "app/bench_products.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "reference/eigen_types.h"

namespace kcp::app {
namespace {

using ref::Mat;

// Operands and results of one chunk, drawn in [-1, 1]. The accumulating products (state, dvnew)
// grow at most linearly over a run: no overflow, no denormals (only the shapes matter for the time).
template <class S>
struct ChunkOperands {
  Mat<S> q, k, kg, w, u, vnew, dvnew, dXu, rhs, dk;  // [C,K] / [C,V]
  Mat<S> h, dh, h_next, dh_in;                      // [K,V]
  Mat<S> Lmat, Aqk, P, dAqk, dP, T, dL, W;          // [C,C]
  Mat<S> wu_in, wu;                                 // [C,K+V]
  Mat<S> wq, wq_h, qw, do_dvnew, do_dXu, do_dXu_hT;  // stacked [2C,K] / [2C,V]
  Mat<S> o, dv_loc, dX, dY;                         // results
  ChunkOperands(int64_t C, int64_t K, int64_t V) {
    for (Mat<S>* m : {&q, &k, &kg, &w, &dk, &dX, &dY}) *m = Mat<S>::Random(C, K);
    for (Mat<S>* m : {&u, &vnew, &dvnew, &dXu, &rhs, &o, &dv_loc}) *m = Mat<S>::Random(C, V);
    for (Mat<S>* m : {&h, &dh, &h_next, &dh_in}) *m = Mat<S>::Random(K, V);
    for (Mat<S>* m : {&Lmat, &Aqk, &P, &dAqk, &dP, &T, &dL, &W}) *m = Mat<S>::Random(C, C);
    for (Mat<S>* m : {&wq, &qw, &do_dXu_hT}) *m = Mat<S>::Random(2 * C, K);
    for (Mat<S>* m : {&wq_h, &do_dvnew, &do_dXu}) *m = Mat<S>::Random(2 * C, V);
    Lmat *= S(1) / S(C);  // keeps (I + Lmat)^-1 well scaled
    wu_in = Mat<S>::Random(C, K + V), wu = wu_in;
  }
};

// Stages kkt, Aqk (gated_gram), solve_tril, WY (one triangular product for [w|u]).
template <class S>
void local_products(ChunkOperands<S>& x) {
  x.Lmat.template triangularView<Eigen::StrictlyLower>() = x.k * x.k.transpose();
  x.Aqk.template triangularView<Eigen::Lower>() = x.q * x.k.transpose();
  x.P.setIdentity();
  x.Lmat.template triangularView<Eigen::UnitLower>().solveInPlace(x.P);
  x.wu.noalias() = x.P.template triangularView<Eigen::UnitLower>() * x.wu_in;
}

// chunkwise_forward_head: local stages, then chunk_state_output ([w; qg] h as one product).
template <class S>
void forward_chunk(ChunkOperands<S>& x) {
  local_products(x);
  x.wq_h.noalias() = x.wq * x.h;
  x.o.noalias() += x.Aqk.template triangularView<Eigen::Lower>() * x.vnew;
  x.h_next.noalias() += x.kg.transpose() * x.vnew;
}

// backward_head: the recompute (local stages, chunk_state), then backward_chunk: dAv, state
// backward ([qg; w]^T [scale do; -dvnew]), the h^T products ([scale do; dXu] h^T), inter, WY
// backward, intra (scalar gate: two gram backwards, two products each).
template <class S>
void backward_chunk(ChunkOperands<S>& x) {
  local_products(x);
  x.vnew.noalias() -= x.w * x.h;
  x.h_next.noalias() += x.kg.transpose() * x.vnew;
  x.dAqk.template triangularView<Eigen::Lower>() = x.u * x.vnew.transpose();
  x.dv_loc.noalias() = x.Aqk.template triangularView<Eigen::Lower>().transpose() * x.u;
  x.dvnew.noalias() += x.kg * x.dh;
  x.dh_in.noalias() += x.qw.transpose() * x.do_dvnew;
  const auto Pt = x.P.template triangularView<Eigen::UnitLower>().transpose();
  x.dXu.noalias() = Pt * x.dvnew;
  x.do_dXu_hT.noalias() = x.do_dXu * x.h.transpose();
  x.dk.noalias() = x.vnew * x.dh.transpose();
  x.rhs.noalias() += x.Lmat.template triangularView<Eigen::StrictlyLower>() * x.vnew;
  x.dP.template triangularView<Eigen::StrictlyLower>() = x.dvnew * x.rhs.transpose();
  x.T.noalias() = Pt * x.dP;
  x.dL.template triangularView<Eigen::StrictlyLower>() = -(x.T * Pt);
  for (int gram = 0; gram < 2; ++gram) {  // gram(q, k) and gram(beta k, k)
    x.dX.noalias() = x.W.template triangularView<Eigen::Lower>() * x.k;
    x.dY.noalias() = x.W.template triangularView<Eigen::Lower>().transpose() * x.q;
  }
}

template <class F>
double best_seconds(int repeat, F&& f) {
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

template <class S>
ProductsTime chunkwise_products_time(int64_t heads, int64_t NT, int64_t C, int64_t K, int64_t V, int repeat) {
  std::vector<ChunkOperands<S>> ops;
  for (int t = 0; t < omp_get_max_threads(); ++t) ops.emplace_back(C, K, V);
  auto run = [&](bool backward) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t hd = 0; hd < heads; ++hd) {
      ChunkOperands<S>& x = ops[size_t(omp_get_thread_num())];
      for (int64_t c = 0; c < NT; ++c) forward_chunk(x);
      if (backward)
        for (int64_t c = 0; c < NT; ++c) backward_chunk(x);
    }
  };
  ProductsTime t;
  t.fwd = best_seconds(repeat, [&] { run(false); });
  t.fwd_bwd = best_seconds(repeat, [&] { run(true); });
  return t;
}

template ProductsTime chunkwise_products_time<float>(int64_t, int64_t, int64_t, int64_t, int64_t, int);
template ProductsTime chunkwise_products_time<double>(int64_t, int64_t, int64_t, int64_t, int64_t, int);

}  // namespace kcp::app
