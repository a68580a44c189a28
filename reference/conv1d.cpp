// Causal depthwise conv1d (formulas in conv1d.h). Channels are independent, so the work is split
// over d with OpenMP; each output element has one writer and sums run in a fixed order.
#include "reference/conv1d.h"

#include <cmath>

#include "core/error.h"
#include "reference/driver.h"
#include "reference/gates.h"

namespace kcp::ref {
namespace {

// Token rows of sequence n as (batch row, first token, length).
SeqRange conv_sequence(const Conv1dProblem& p, int64_t n) {
  if (p.cu_seqlens.empty()) return {n, 0, p.T};
  return {0, p.cu_seqlens[size_t(n)], p.cu_seqlens[size_t(n) + 1] - p.cu_seqlens[size_t(n)]};
}
int64_t conv_sequences(const Conv1dProblem& p) {
  return p.cu_seqlens.empty() ? p.B : int64_t(p.cu_seqlens.size()) - 1;
}

// One channel d of sequence s as a padded column: W-1 history values (halo or zeros), then the tokens.
template <class S>
std::vector<S> padded_column(const Conv1dProblem& p, const TensorView& x, const TensorView& halo, int64_t n,
                             const SeqRange& s, int64_t d) {
  std::vector<S> col(size_t(s.len + p.W - 1), S(0));
  if (n == 0 && p.halo > 0)
    view_load<S>(halo, d * halo.stride[1], p.halo, halo.stride[0], col.data() + (p.W - 1 - p.halo));
  view_load<S>(x, s.b * x.stride[0] + s.t0 * x.stride[1] + d * x.stride[2], s.len, x.stride[1], col.data() + p.W - 1);
  return col;
}

template <class S>
void forward_impl(const Conv1dProblem& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                  const TensorView& halo, const TensorView& y) {
  parallel_tasks(p.D, [&](int64_t d) {
    std::vector<S> wd(size_t(p.W));
    view_load<S>(w, d * w.stride[0], p.W, w.stride[1], wd.data());
    const S b = bias.empty() ? S(0) : S(bias.get(d * bias.stride[0]));
    for (int64_t n = 0; n < conv_sequences(p); ++n) {
      const SeqRange s = conv_sequence(p, n);
      const std::vector<S> col = padded_column<S>(p, x, halo, n, s, d);
      std::vector<S> out(size_t(s.len));
      for (int64_t t = 0; t < s.len; ++t) {
        S z = b;
        for (int64_t i = 0; i < p.W; ++i) z += wd[size_t(i)] * col[size_t(t + i)];
        out[size_t(t)] = p.silu ? z * sigmoid(z) : z;
      }
      view_store<S>(y, s.b * y.stride[0] + s.t0 * y.stride[1] + d * y.stride[2], s.len, y.stride[1], out.data());
    }
  });
}

template <class S>
void backward_impl(const Conv1dProblem& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& halo, const TensorView& dy, const TensorView& dx, const TensorView& dw,
                   const TensorView& db, const TensorView& dhalo) {
  parallel_tasks(p.D, [&](int64_t d) {
    std::vector<S> wd(size_t(p.W)), dwd(size_t(p.W), S(0));
    view_load<S>(w, d * w.stride[0], p.W, w.stride[1], wd.data());
    const S b = bias.empty() ? S(0) : S(bias.get(d * bias.stride[0]));
    S dbd = 0;
    for (int64_t n = 0; n < conv_sequences(p); ++n) {
      const SeqRange s = conv_sequence(p, n);
      const std::vector<S> col = padded_column<S>(p, x, halo, n, s, d);
      std::vector<S> dz(size_t(s.len)), dcol(col.size(), S(0));
      view_load<S>(dy, s.b * dy.stride[0] + s.t0 * dy.stride[1] + d * dy.stride[2], s.len, dy.stride[1], dz.data());
      for (int64_t t = 0; t < s.len; ++t) {
        if (p.silu) {
          S z = b;
          for (int64_t i = 0; i < p.W; ++i) z += wd[size_t(i)] * col[size_t(t + i)];
          const S sg = sigmoid(z);
          dz[size_t(t)] *= sg * (S(1) + z * (S(1) - sg));
        }
        dbd += dz[size_t(t)];
        for (int64_t i = 0; i < p.W; ++i) {
          dwd[size_t(i)] += dz[size_t(t)] * col[size_t(t + i)];
          dcol[size_t(t + i)] += wd[size_t(i)] * dz[size_t(t)];
        }
      }
      if (!dx.empty())
        view_store<S>(dx, s.b * dx.stride[0] + s.t0 * dx.stride[1] + d * dx.stride[2], s.len, dx.stride[1],
                      dcol.data() + p.W - 1);
      if (n == 0 && p.halo > 0 && !dhalo.empty())
        view_store<S>(dhalo, d * dhalo.stride[1], p.halo, dhalo.stride[0], dcol.data() + (p.W - 1 - p.halo));
    }
    if (!dw.empty()) view_store<S>(dw, d * dw.stride[0], p.W, dw.stride[1], dwd.data());
    if (!db.empty()) db.set(d * db.stride[0], double(dbd));
  });
}

}  // namespace

void conv1d_forward(const Conv1dProblem& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& halo, const TensorView& y) {
  KCP_CHECK(y.shape == x.shape, "y: expected shape ", shape_str(x.shape), ", got ", shape_str(y.shape));
  if (p.compute == DType::f64) forward_impl<double>(p, x, weight, bias, halo, y);
  else forward_impl<float>(p, x, weight, bias, halo, y);
}

void conv1d_backward(const Conv1dProblem& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                     const TensorView& halo, const TensorView& dy, const TensorView& dx, const TensorView& dweight,
                     const TensorView& dbias, const TensorView& dhalo) {
  KCP_CHECK(dy.shape == x.shape, "dy: expected shape ", shape_str(x.shape), ", got ", shape_str(dy.shape));
  KCP_CHECK(dx.empty() || dx.shape == x.shape, "dx: expected shape ", shape_str(x.shape));
  KCP_CHECK(dweight.empty() || dweight.shape == weight.shape, "dweight: expected shape ", shape_str(weight.shape));
  KCP_CHECK(dbias.empty() || dbias.shape == Shape{p.D}, "dbias: expected shape [D]");
  KCP_CHECK(dhalo.empty() || dhalo.shape == (Shape{p.halo, p.D}), "dhalo: expected shape [P,D]");
  if (p.compute == DType::f64) backward_impl<double>(p, x, weight, bias, halo, dy, dx, dweight, dbias, dhalo);
  else backward_impl<float>(p, x, weight, bias, halo, dy, dx, dweight, dbias, dhalo);
}

}  // namespace kcp::ref
