// merge_linear and merge_log_depth (see merge.h).
#include "cp/merge.h"

#include <chrono>

#include "core/transition.h"

namespace kcp::cp {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TensorView element0(const TensorView& packed) { return transition_element(packed, 0); }

}  // namespace

MergeTimes merge_linear(Comm& comm, Queue& q, const TensorView& mine, int64_t first, int64_t count, bool reverse,
                        const TensorView& out, MergeBuffers* buffers) {
  MergeTimes t;
  const int64_t per_rank = mine.numel();
  Shape all_shape = mine.shape;
  all_shape[0] = comm.size();
  MergeBuffers local;
  const TensorView all = (buffers ? *buffers : local).gather.reuse(q, mine.dtype, all_shape);
  auto t0 = Clock::now();
  comm.all_gather(mine.data, all.data, per_rank, mine.dtype);
  t.exchange = since(t0);
  t0 = Clock::now();
  if (!out.empty()) q.transition_fold(all, first, count, reverse, {}, out);
  q.synchronize();
  t.merge = since(t0);
  return t;
}

MergeTimes merge_log_depth(Comm& comm, Queue& q, const TensorView& mine, bool reverse, const TensorView& out,
                           MergeBuffers* buffers) {
  MergeTimes t;
  const auto t0 = Clock::now();
  const int P = comm.size();
  const int v = reverse ? P - 1 - comm.rank() : comm.rank();
  auto rank_at = [&](int u) { return u < 0 || u >= P ? kNoRank : (reverse ? P - 1 - u : u); };
  MergeBuffers local;
  MergeBuffers& b = buffers ? *buffers : local;
  for (DeviceTensor* e : {&b.x, &b.y, &b.z}) e->reuse(q, mine.dtype, mine.shape);
  DeviceTensor &x = b.x, &y = b.y, &z = b.z;  // x and z trade buffers after each composition
  q.copy_view(x.view, mine);
  int tag = 0x5ca0;
  // after the round with distance d, x covers virtual ranks [max(0, v-2d+1), v]
  for (int d = 1; d < P; d *= 2, ++tag) {
    q.synchronize();  // x is complete before it is sent
    comm.send_recv(x.view.data, rank_at(v + d), y.view.data, rank_at(v - d), x.view.numel(), x.view.dtype, tag);
    if (v - d >= 0) {
      q.transition_compose(element0(x.view), element0(y.view), element0(z.view));
      std::swap(x, z);
    }
  }
  // exclusive: the inclusive prefix of virtual rank v-1
  q.synchronize();
  comm.send_recv(x.view.data, rank_at(v + 1), y.view.data, rank_at(v - 1), x.view.numel(), x.view.dtype, tag);
  if (!out.empty()) {
    if (v == 0) q.fill_zero(out);
    else q.copy_view(out, transition_s(element0(y.view)));
  }
  q.synchronize();
  t.exchange = since(t0);  // communication and merge interleave
  return t;
}

}  // namespace kcp::cp
