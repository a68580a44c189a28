// The execution context of a backend (docs/ARCHITECTURE.md): the device its memory lives on and the
// queue its work runs in, so that callers (the harness, the CP layer, benchmarks) never branch on a
// backend's name. The host queue runs everything synchronously on the calling thread; the CUDA queue
// (cuda/queue_cuda.h) is one device and one stream, and every operation below is asynchronous on that
// stream unless it says otherwise.
//   memory:   alloc/release (device memory), alloc_host/release_host (host staging: pinned for CUDA),
//             copy (any direction, ordered on the queue), synchronize
//   timing:   time_ms(body): device time of the work body enqueues (CUDA events; wall time on the host)
//   views:    copy_view(dst, src)  dst = src, same shape (rank <= 4), any strides, any float dtypes
//             add_view(dst, src)   dst += src (same rules)
//             fill_zero(dst)
//             pad_view(dst, src)   dst = src zero-extended (dst's extent >= src's on every axis)
//   algebra on packed transitions (core/transition.h): fold, scan, compose, start, identity
//   device facts: multiprocessor_count() (what a planner fills: CUDA SMs; 1 on the host)
// Views passed to a queue must live on its device(); the host versions of the view and algebra
// operations are the reference the CUDA ones are tested against (tests/cuda/test_cuda_transition.cpp).
// Covered by tests/core/test_transition.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kcp {

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

// Elements [first, first + count) of a packed transition buffer.
struct TransitionRange {
  int64_t first = 0, count = 0;
};

class Queue {
 public:
  virtual ~Queue() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;        // "host", "cuda:0 (NVIDIA H100 80GB HBM3) stream 0x..."
  virtual int device_index() const { return -1; }  // the CUDA ordinal; -1 on the host
  virtual void* native_stream() const { return nullptr; }  // cudaStream_t of a CUDA queue
  // Independent workers the device runs blocks on (CUDA: streaming multiprocessors). The host queue
  // answers 1: the CPU backends spread (sequence, head) pairs over OpenMP threads themselves, and a
  // planner that splits sequences for parallelism (segment/plan.h) has nothing to fill there.
  virtual int multiprocessor_count() const { return 1; }
  // Bytes of device memory in use on this queue's device, by every process (CUDA: total - free of
  // cudaMemGetInfo, 2 MiB pages); -1 on the host. A difference of two readings is what was allocated
  // between them (kcp bench's "MiB held").
  virtual int64_t device_memory_used() const { return -1; }

  virtual void* alloc(size_t bytes) = 0;  // throws kcp::Error naming the size when it fails
  virtual void release(void* ptr) noexcept = 0;
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void release_host(void* ptr) noexcept = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind) = 0;
  virtual void synchronize() = 0;
  virtual double time_ms(const std::function<void()>& body) = 0;

  virtual void copy_view(const TensorView& dst, const TensorView& src) = 0;
  virtual void add_view(const TensorView& dst, const TensorView& src) = 0;
  virtual void fill_zero(const TensorView& dst) = 0;
  // dst = src zero-extended: same rank (<= 4), dst.dim(i) >= src.dim(i); dst's elements inside src's
  // extent get src's values (dtype converted), every other element 0. Default: fill_zero, then
  // copy_view into the leading corner; the CUDA queue does it in one pass.
  virtual void pad_view(const TensorView& dst, const TensorView& src);

  // Packed transitions [.., HV, K, V+K] (core/transition.h), float32 or float64 (one dtype per call).
  // fold:     x = x0 (zeros when x0 is empty); for j = first .. first+count-1 (or the reverse order):
  //           x = M_j x + S_j; out [HV,K,V] = x. `elems` is [P, HV, K, V+K].
  virtual void transition_fold(const TensorView& elems, int64_t first, int64_t count, bool reverse,
                               const TensorView& x0, const TensorView& out) = 0;
  // scan:     for each range r independently: x = 0; for j in r (ascending): x = M_j x + S_j; out[j] = x
  //           (the inclusive prefix states of each range; entries of out outside every range are left
  //           alone). elems [E, HV, K, V+K], out [E, HV, K, V] contiguous, same float dtype; the ranges
  //           must not overlap. A range that starts a sequence from h0 has its first element reset by
  //           transition_start(first, h0). Default: one transition_fold per element (any queue);
  //           the CUDA queue runs all ranges in one launch.
  virtual void transition_scan(const TensorView& elems, const std::vector<TransitionRange>& ranges,
                               const TensorView& out);
  // compose:  out = later o earlier = (M_l M_e, M_l S_e + S_l), each [HV, K, V+K]; out may alias neither.
  virtual void transition_compose(const TensorView& later, const TensorView& earlier, const TensorView& out) = 0;
  // start:    the run begins here: S = M x0 + S (x0 [HV,K,V], optional), then M = 0 (a reset: nothing
  //           before this run reaches past it). t is [HV, K, V+K].
  virtual void transition_start(const TensorView& t, const TensorView& x0) = 0;
  // identity: M = I, S = 0 (the element of a rank with no tokens).
  virtual void transition_identity(const TensorView& t) = 0;
};

// The host queue every CPU backend shares (stateless, thread-compatible).
Queue& host_queue();

// Memory of a queue's device, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Queue& q, size_t bytes) : queue_(&q), ptr_(bytes ? q.alloc(bytes) : nullptr), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(queue_, o.queue_), std::swap(ptr_, o.ptr_), std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) queue_->release(ptr_);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Queue* queue() const { return queue_; }

 private:
  Queue* queue_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A contiguous tensor in a queue's memory: a DeviceBuffer with its view. Zero elements still get a
// non-null pointer (a null view means "absent" to the backends).
struct DeviceTensor {
  DeviceBuffer buf;
  TensorView view;
  DeviceTensor() = default;
  DeviceTensor(Queue& q, DType dt, Shape shape);
  // This tensor as [dt, shape] on q, reallocated only when the dtype, shape or queue differ (a buffer
  // kept across calls); the contents are whatever the last user left.
  const TensorView& reuse(Queue& q, DType dt, const Shape& shape);
};

// Copies a view of any device to a host tensor / a host tensor into a device view (synchronous).
template <class S> Tensor<S> download_tensor(Queue& q, const TensorView& v);
void upload_view(Queue& q, const TensorView& dst, const TensorView& host_src);

}  // namespace kcp
