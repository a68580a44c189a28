// Halo exchange around the local conv1d (see conv1d_cp.h). Tails and halo gradients travel as
// [W-1, D] blocks per rank, right-aligned: row W-1-m+i holds the i-th of the m tokens just before
// the block's edge, so a token's row is found from its distance to that edge.
#include "cp/conv1d_cp.h"

#include <sstream>

#include "cp/agreement.h"
#include "reference/conv1d.h"

namespace kcp::cp {
namespace {

int64_t halo_tokens(const CpContext& c, int64_t W) { return std::min(W - 1, c.pre_num_conv_tokens); }

void check_local(const ConvCp& c, const TensorView& x, const TensorView& weight, const TensorView* dx) {
  KCP_CHECK(!dx || (!dx->empty() && dx->shape == x.shape), "dx: expected shape ", shape_str(x.shape));
  KCP_CHECK(x.rank() == 3 && x.dim(0) == 1 && x.dim(1) == c.ctx.tokens(), "x: rank ", c.ctx.rank, " owns ",
            c.ctx.tokens(), " tokens, expected [1, ", c.ctx.tokens(), ", D], got ", shape_str(x.shape));
  KCP_CHECK(weight.rank() == 2 && weight.dim(0) == x.dim(2) && weight.dim(1) >= 1, "weight: expected [D,W] with D = ",
            x.dim(2), ", got ", shape_str(weight.shape));
  KCP_CHECK(x.device == Device::host, "x: the CP conv works on host views");
}

// Validates this rank's arguments, then agrees with the other ranks on the configuration.
void check_args(Comm& comm, const ConvCp& c, const char* what, const TensorView& x, const TensorView& weight,
                const TensorView& bias, const TensorView* dx) {
  std::ostringstream os;
  std::string err;
  try {
    os << "D=" << (x.rank() == 3 ? x.dim(2) : -1) << " weight=" << shape_str(weight.shape) << " values "
       << content_hash(weight) << " bias " << content_hash(bias) << " silu=" << c.silu
       << " compute=" << dtype_name(c.compute) << " bounds=";
    for (int64_t b : c.ctx.bounds) os << b << ",";
    os << " cu=";
    for (int64_t b : c.cu_seqlens) os << b << ",";
    check_local(c, x, weight, dx);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm, what, os.str(), err);
}

// Every rank's last min(W-1, T_local) tokens of x, gathered as [P, W-1, D].
template <class S>
std::vector<S> gather_tails(Comm& comm, const ConvCp& c, const TensorView& x, int64_t W, int64_t D) {
  const int64_t m = std::min(W - 1, c.ctx.tokens());
  std::vector<S> tail(size_t((W - 1) * D), S(0)), all(size_t(comm.size() * (W - 1) * D));
  for (int64_t i = 0; i < m; ++i)
    view_load<S>(x, (c.ctx.tokens() - m + i) * x.stride[1], D, x.stride[2], tail.data() + (W - 1 - m + i) * D);
  all_gather(comm, tail.data(), all.data(), (W - 1) * D);
  return all;
}

// The halo of this rank, [h, D]: global tokens [lo-h, lo) read from the tails of their owners.
template <class S>
Tensor<S> build_halo(const ConvCp& c, const std::vector<S>& tails, int64_t W, int64_t D) {
  const int64_t h = halo_tokens(c.ctx, W);
  Tensor<S> halo({h, D});
  for (int64_t i = 0; i < h; ++i) {
    const int64_t t = c.ctx.lo - h + i;
    const int j = rank_of_token(c.ctx.bounds, t);
    const int64_t row = (W - 1) - (c.ctx.bounds[size_t(j) + 1] - t);
    for (int64_t d = 0; d < D; ++d) halo(i, d) = tails[size_t((j * (W - 1) + row) * D + d)];
  }
  return halo;
}

template <class S>
void forward_impl(Comm& comm, const ConvCp& c, const TensorView& x, const TensorView& w, const TensorView& b,
                  const TensorView& y) {
  const int64_t W = w.dim(1), D = x.dim(2);
  const std::vector<S> tails = gather_tails<S>(comm, c, x, W, D);
  if (c.ctx.empty()) return;
  const Tensor<S> halo = build_halo(c, tails, W, D);
  const auto p = ref::make_conv1d_problem(x, w, b, c.ctx.local_cu, c.silu, halo.numel() ? halo.view() : TensorView(),
                                          c.compute);
  ref::conv1d_forward(p, x, w, b, halo.numel() ? halo.view() : TensorView(), y);
}

template <class S>
void backward_impl(Comm& comm, const ConvCp& c, const TensorView& x, const TensorView& w, const TensorView& b,
                   const TensorView& dy, const TensorView& dx, const TensorView& dw, const TensorView& db) {
  const int64_t W = w.dim(1), D = x.dim(2), h = halo_tokens(c.ctx, W);
  const std::vector<S> tails = gather_tails<S>(comm, c, x, W, D);
  Tensor<S> dw_part({D, W}), db_part({D}), dhalo({h, D});
  std::vector<S> dhalo_block(size_t((W - 1) * D), S(0)), all(size_t(comm.size() * (W - 1) * D));
  if (!c.ctx.empty()) {
    const Tensor<S> halo = build_halo(c, tails, W, D);
    const TensorView hv = h ? halo.view() : TensorView();
    const auto p = ref::make_conv1d_problem(x, w, b, c.ctx.local_cu, c.silu, hv, c.compute);
    ref::conv1d_backward(p, x, w, b, hv, dy, dx, dw_part.view(), b.empty() ? TensorView() : db_part.view(),
                         h ? dhalo.view() : TensorView());
    for (int64_t i = 0; i < h * D; ++i) dhalo_block[size_t((W - 1 - h) * D + i)] = dhalo.data()[i];
  }
  all_gather(comm, dhalo_block.data(), all.data(), (W - 1) * D);
  // add every later rank's halo gradient on the tokens this rank owns, in rank order
  for (int r = c.ctx.rank + 1; r < comm.size() && !c.ctx.empty(); ++r) {
    const CpContext cr = build_cp_context(c.cu_seqlens, c.ctx.bounds, r);
    const int64_t hr = halo_tokens(cr, W);
    for (int64_t i = 0; i < hr; ++i) {
      const int64_t t = cr.lo - hr + i;
      if (t < c.ctx.lo || t >= c.ctx.hi) continue;
      for (int64_t d = 0; d < D; ++d) {
        const int64_t off = (t - c.ctx.lo) * dx.stride[1] + d * dx.stride[2];
        dx.set(off, dx.get(off) + double(all[size_t((r * (W - 1) + (W - 1 - hr) + i) * D + d)]));
      }
    }
  }
  all_reduce_sum(comm, dw_part.data(), dw_part.numel());
  all_reduce_sum(comm, db_part.data(), db_part.numel());
  if (!dw.empty())
    for (int64_t d = 0; d < D; ++d)
      for (int64_t i = 0; i < W; ++i) dw.set(d * dw.stride[0] + i * dw.stride[1], double(dw_part(d, i)));
  if (!db.empty())
    for (int64_t d = 0; d < D; ++d) db.set(d * db.stride[0], double(db_part(d)));
}

}  // namespace

void conv1d_cp_forward(Comm& comm, const ConvCp& c, const TensorView& x, const TensorView& weight,
                       const TensorView& bias, const TensorView& y) {
  check_args(comm, c, "cp conv1d forward", x, weight, bias, nullptr);
  if (c.compute == DType::f64) forward_impl<double>(comm, c, x, weight, bias, y);
  else forward_impl<float>(comm, c, x, weight, bias, y);
}

void conv1d_cp_backward(Comm& comm, const ConvCp& c, const TensorView& x, const TensorView& weight,
                        const TensorView& bias, const TensorView& dy, const TensorView& dx, const TensorView& dweight,
                        const TensorView& dbias) {
  check_args(comm, c, "cp conv1d backward", x, weight, bias, &dx);
  if (c.compute == DType::f64) backward_impl<double>(comm, c, x, weight, bias, dy, dx, dweight, dbias);
  else backward_impl<float>(comm, c, x, weight, bias, dy, dx, dweight, dbias);
}

}  // namespace kcp::cp
