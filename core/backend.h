// The one interface every algorithm implements (cpu-recurrent, cpu-chunkwise, cuda-chunkwise) and
// the only thing the CP layer and the harness see (ggml's backend table + FlashAttention's params).
//
//   forward:   o = op(inputs), final_state per sequence (FLA semantics, problem.h)
//   backward:  gradients of L = sum(o * d_o) + sum(final_state * d_final_state) w.r.t. every input
//              as passed (raw gate, raw beta, un-normalized q/k when the flags fuse them)
//   transition_forward(seq):  the affine map of one sequence, state_out = M state_in + S_ext,
//              S_ext = its final state from a zero initial state, M [K,K] (initial_state ignored)
//   transition_backward(seq): the transposed chain, dS_in = M^T dS_out + dS_ext, where dS_ext is
//              dL/dS_in of that sequence's outputs with d_final_state = 0; returns M^T as dm
// Transition tensors are always in the K-major math layout, whatever flags.state_v_first says:
//   s_ext [HV,K,V], m [HV,K,K] (float32 or float64, host or device as the backend's device()).
// Covered by tests/reference/test_backend_cpu.cpp and the per-backend suites.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <string>
#include <string_view>

#include "core/problem.h"

namespace kcp {

struct Support {
  bool ok = true;
  std::string reason;  // why not, when !ok ("chunk_size 48: cpu-chunkwise supports 16, 32, 64")
  explicit operator bool() const { return ok; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

struct Transition {
  TensorView s_ext;  // [HV,K,V]
  TensorView m;      // [HV,K,K]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;  // where every view passed in must live
  virtual Support supports(const Problem& p) const = 0;
  // Whether backward and transition_backward run for p (a forward-only backend says why not here,
  // so callers such as `kcp check` can judge its outputs and skip the gradients).
  virtual Support supports_backward(const Problem& p) const { return supports(p); }

  virtual void forward(const Problem& p, const Inputs& in, const Outputs& out) = 0;
  virtual void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) = 0;
  virtual void transition_forward(const Problem& p, const Inputs& in, int64_t seq, const Transition& tr) = 0;
  virtual void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o,
                                   int64_t seq, const Transition& tr) = 0;
  virtual void synchronize() {}

  // Memory of device(): the harness stages tensors through these, so it never branches on a
  // backend's name. Host backends use plain host memory (the defaults).
  virtual void* alloc(size_t bytes);
  virtual void release(void* ptr);
  virtual void upload(void* dst, const void* src, size_t bytes);    // host -> device()
  virtual void download(void* dst, const void* src, size_t bytes);  // device() -> host
};

// A buffer in a backend's memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& b, size_t bytes) : backend_(&b), ptr_(bytes ? b.alloc(bytes) : nullptr), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(backend_, o.backend_), std::swap(ptr_, o.ptr_), std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { if (ptr_) backend_->release(ptr_); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Throws kcp::Error naming the backend and the reason when `b` cannot run `p`.
void require_support(const Backend& b, const Problem& p);

}  // namespace kcp
