// Halo exchange around the local conv1d (see conv1d_cp.h), on the backend's queue. Tails and halo
// gradients travel as [W-1, D] blocks per rank, right-aligned: row W-1-m+i holds the i-th of the m
// tokens just before the block's edge, so a token's row is found from its distance to that edge.
#include "cp/conv1d_cp.h"

#include <sstream>

#include "cp/agreement.h"

namespace kcp::cp {
namespace {

int64_t halo_tokens(const CpContext& c, int64_t W) { return std::min(W - 1, c.pre_num_conv_tokens); }

// Tokens [t0, t0+n) of a [1,T,D] view as an [n, D] view.
TensorView token_rows(const TensorView& x, int64_t t0, int64_t n) {
  const TensorView r = x.narrow(1, t0, n);
  TensorView v(r.data, r.dtype, {n, x.dim(2)}, r.device);
  v.stride = {x.stride[1], x.stride[2]};
  return v;
}

void check_local(Backend& be, const ConvCp& c, const TensorView& x, const TensorView& weight, const TensorView* dx) {
  KCP_CHECK(!dx || (!dx->empty() && dx->shape == x.shape), "dx: expected shape ", shape_str(x.shape));
  KCP_CHECK(x.rank() == 3 && x.dim(0) == 1 && x.dim(1) == c.ctx.tokens(), "x: rank ", c.ctx.rank, " owns ",
            c.ctx.tokens(), " tokens, expected [1, ", c.ctx.tokens(), ", D], got ", shape_str(x.shape));
  KCP_CHECK(weight.rank() == 2 && weight.dim(0) == x.dim(2) && weight.dim(1) >= 1, "weight: expected [D,W] with D = ",
            x.dim(2), ", got ", shape_str(weight.shape));
  KCP_CHECK(x.device == be.device() && weight.device == be.device(), "x, weight: must live on the backend's device (",
            be.queue().describe(), ")");
}

// Validates this rank's arguments, then agrees with the other ranks on the configuration.
void check_args(Comm& comm, Backend& be, const ConvCp& c, const char* what, const TensorView& x,
                const TensorView& weight, const TensorView& bias, const TensorView* dx) {
  std::ostringstream os;
  std::string err;
  try {
    os << "D=" << (x.rank() == 3 ? x.dim(2) : -1) << " weight=" << shape_str(weight.shape) << " silu=" << c.silu
       << " compute=" << dtype_name(c.compute) << " backend=" << be.name() << " bounds=";
    for (int64_t b : c.ctx.bounds) os << b << ",";
    os << " cu=";
    for (int64_t b : c.cu_seqlens) os << b << ",";
    check_local(be, c, x, weight, dx);
    os << " values " << content_hash(be.queue(), weight) << " bias " << content_hash(be.queue(), bias);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_on_config(comm.control(), what, os.str(), err);
}

// Every rank's last min(W-1, T_local) tokens of x, gathered as [P, W-1, D] in the compute precision.
DeviceTensor gather_tails(Comm& comm, Queue& q, const ConvCp& c, const TensorView& x, int64_t W, int64_t D) {
  const int64_t m = std::min(W - 1, c.ctx.tokens());
  DeviceTensor tail(q, c.compute, {W - 1, D}), all(q, c.compute, {comm.size(), W - 1, D});
  q.fill_zero(tail.view);
  if (m > 0) q.copy_view(tail.view.narrow(0, W - 1 - m, m), token_rows(x, c.ctx.tokens() - m, m));
  q.synchronize();
  comm.all_gather(tail.view.data, all.view.data, (W - 1) * D, c.compute);
  return all;
}

// Row `row` of rank j's block in a gathered [P, W-1, D] buffer, as [D].
TensorView block_row(const TensorView& all, int64_t j, int64_t row) {
  TensorView v = all.narrow(0, j, 1).narrow(1, row, 1);
  v.shape = {all.dim(2)}, v.stride = {all.stride[2]};
  return v;
}
TensorView row_of(const TensorView& m, int64_t i) {  // row i of [n, D] as [D]
  TensorView v = m.narrow(0, i, 1);
  v.shape = {m.dim(1)}, v.stride = {m.stride[1]};
  return v;
}

// The halo of this rank, [h, D]: global tokens [lo-h, lo) read from the tails of their owners.
DeviceTensor build_halo(Queue& q, const ConvCp& c, const TensorView& tails, int64_t W, int64_t D) {
  const int64_t h = halo_tokens(c.ctx, W);
  DeviceTensor halo(q, c.compute, {h, D});
  for (int64_t i = 0; i < h; ++i) {
    const int64_t t = c.ctx.lo - h + i;
    const int j = rank_of_token(c.ctx.bounds, t);
    q.copy_view(row_of(halo.view, i), block_row(tails, j, (W - 1) - (c.ctx.bounds[size_t(j) + 1] - t)));
  }
  return halo;
}

}  // namespace

void conv1d_cp_forward(Comm& comm, Backend& be, const ConvCp& c, const TensorView& x, const TensorView& weight,
                       const TensorView& bias, const TensorView& y) {
  check_args(comm, be, c, "cp conv1d forward", x, weight, bias, nullptr);
  Queue& q = be.queue();
  const int64_t W = weight.dim(1), D = x.dim(2);
  const DeviceTensor tails = gather_tails(comm, q, c, x, W, D);
  if (c.ctx.empty()) return;
  const DeviceTensor halo = build_halo(q, c, tails.view, W, D);
  const TensorView hv = halo.view.dim(0) ? halo.view : TensorView();
  const Conv1dProblem p = make_conv1d_problem(x, weight, bias, c.ctx.local_cu, c.silu, hv, c.compute);
  be.conv1d_forward(p, {x, weight, bias, hv}, y);
  q.synchronize();  // tails and halo are freed on return
}

void conv1d_cp_backward(Comm& comm, Backend& be, const ConvCp& c, const TensorView& x, const TensorView& weight,
                        const TensorView& bias, const TensorView& dy, const TensorView& dx, const TensorView& dw,
                        const TensorView& db) {
  check_args(comm, be, c, "cp conv1d backward", x, weight, bias, &dx);
  Queue& q = be.queue();
  const int64_t W = weight.dim(1), D = x.dim(2), h = halo_tokens(c.ctx, W);
  const DeviceTensor tails = gather_tails(comm, q, c, x, W, D);
  DeviceTensor dw_part(q, c.compute, {D, W}), db_part(q, c.compute, {D}), dhalo(q, c.compute, {h, D});
  DeviceTensor block(q, c.compute, {W - 1, D}), all(q, c.compute, {comm.size(), W - 1, D});
  q.fill_zero(block.view), q.fill_zero(dw_part.view), q.fill_zero(db_part.view);
  if (!c.ctx.empty()) {
    const DeviceTensor halo = build_halo(q, c, tails.view, W, D);
    const TensorView hv = h ? halo.view : TensorView();
    const Conv1dProblem p = make_conv1d_problem(x, weight, bias, c.ctx.local_cu, c.silu, hv, c.compute);
    be.conv1d_backward(p, {x, weight, bias, hv}, dy,
                       {dx, dw_part.view, bias.empty() ? TensorView() : db_part.view, h ? dhalo.view : TensorView()});
    if (h) q.copy_view(block.view.narrow(0, W - 1 - h, h), dhalo.view);
    q.synchronize();
  }
  comm.all_gather(block.view.data, all.view.data, (W - 1) * D, c.compute);
  // add every later rank's halo gradient on the tokens this rank owns, in rank order
  for (int r = c.ctx.rank + 1; r < comm.size() && !c.ctx.empty(); ++r) {
    const CpContext cr = build_cp_context(c.cu_seqlens, c.ctx.bounds, r);
    const int64_t hr = halo_tokens(cr, W);
    for (int64_t i = 0; i < hr; ++i) {
      const int64_t t = cr.lo - hr + i;
      if (t < c.ctx.lo || t >= c.ctx.hi) continue;
      q.add_view(row_of(token_rows(dx, t - c.ctx.lo, 1), 0), block_row(all.view, r, (W - 1 - hr) + i));
    }
  }
  q.synchronize();
  comm.all_reduce_sum(dw_part.view.data, dw_part.view.numel(), c.compute);
  comm.all_reduce_sum(db_part.view.data, db_part.view.numel(), c.compute);
  if (!dw.empty()) q.copy_view(dw, dw_part.view);
  if (!db.empty()) q.copy_view(db, db_part.view);
  q.synchronize();
}

}  // namespace kcp::cp
