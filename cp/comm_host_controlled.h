// The part of a communicator on device buffers (comm_device.h: the staged MPI one, the NCCL one) that
// only forwards to its host control communicator: rank, size, control, barrier (the queue drained
// first, so that no device work of this rank is still in flight when the others pass), abort, and
// split (a communicator of the same kind over the host communicator's split, which it then owns).
// Internal to kcp_cp. Covered by tests/cp/test_cp_mpi.cpp (the staged communicator on the host
// queue, split included) and, on a GPU machine, `kcp cp-sweep --comm mpi|nccl` (scripts/gpu.sh).
#pragma once

#include <cstdlib>
#include <memory>
#include <string_view>

#include "core/queue.h"
#include "cp/comm.h"

namespace kcp::cp {

// Derived: the concrete communicator, constructible as Derived(Comm& host, Queue& queue).
template <class Derived>
class HostControlledComm : public Comm {
 public:
  HostControlledComm(Comm& host, Queue& q) : host_(host), q_(q) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  Comm& control() override { return host_; }
  void barrier() override {
    q_.synchronize();
    host_.barrier();
  }
  [[noreturn]] void abort(int code, std::string_view message) override {
    host_.abort(code, message);
    std::_Exit(code);  // not reached: keeps [[noreturn]] honest through the virtual call
  }
  std::unique_ptr<Comm> split(int color) override {
    std::unique_ptr<Comm> sub = host_.split(color);
    auto c = std::make_unique<Derived>(*sub, q_);
    static_cast<HostControlledComm&>(*c).owned_host_ = std::move(sub);
    return c;
  }

 protected:
  // Declared first, destroyed last: a split's host communicator outlives everything built on it.
  std::unique_ptr<Comm> owned_host_;
  Comm& host_;
  Queue& q_;
};

}  // namespace kcp::cp
