// Comm: the collectives the context-parallel layer needs, on buffers described by (pointer, element
// count, DType) only, so that MPI on host memory (comm_mpi.cpp), MPI on device memory staged through
// pinned host buffers (comm_staged.cpp) and NCCL on device memory and the backend's stream
// (comm_nccl.cpp) plug in behind the same calls. No MPI, NCCL or CUDA type appears here.
//   device(): where the data buffers live (a device comm is bound to one Queue); control(): a host
//   communicator over the same ranks for configuration hashes, verdicts and aborts (itself for MPI)
//   all_gather: every rank sends `count` elements; recv holds size()*count, rank-major
//   all_reduce: element-wise sum or max over ranks, in place
//   send/recv/send_recv: point-to-point (send_recv pairs a send and a receive so shifts and
//   Hillis-Steele rounds cannot deadlock); kNoRank skips that half
// Covered by tests/cp/test_cp_mpi.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kcp::cp {

enum class ReduceOp { sum, max };
inline constexpr int kNoRank = -1;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string_view name() const = 0;  // "mpi", "mpi-staged", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const { return Device::host; }
  virtual Comm& control() { return *this; }

  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void send(const void* buf, int64_t count, DType dtype, int dst, int tag) = 0;
  virtual void recv(void* buf, int64_t count, DType dtype, int src, int tag) = 0;
  virtual void send_recv(const void* send, int dst, void* recv, int src, int64_t count, DType dtype, int tag) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with `code` after printing `message` from this rank.
  [[noreturn]] virtual void abort(int code, std::string_view message) = 0;
  // Ranks with the same color form a new communicator, ordered by their rank here.
  virtual std::unique_ptr<Comm> split(int color) = 0;

  void all_reduce_sum(void* buf, int64_t count, DType dtype) { all_reduce(buf, count, dtype, ReduceOp::sum); }
};

// Typed conveniences over the byte/dtype calls.
template <class T>
void all_reduce_sum(Comm& c, T* buf, int64_t count) { c.all_reduce(buf, count, dtype_of<T>(), ReduceOp::sum); }
template <class T>
void all_reduce_max(Comm& c, T* buf, int64_t count) { c.all_reduce(buf, count, dtype_of<T>(), ReduceOp::max); }
template <class T>
void all_gather(Comm& c, const T* send, T* recv, int64_t count) { c.all_gather(send, recv, count, dtype_of<T>()); }

}  // namespace kcp::cp
