// The one-launch kda chains of this process in flight, per device (chunkwise_windows.cu). Such a
// chain's blocks each hold a whole multiprocessor and spin until their window's fronts (kkt, WY) have
// signalled; the fronts need multiprocessors the chains do not hold. Pipelines on other streams (other
// threads, several pipelines of one program, CP's segments in one process) may run windowed forwards
// at the same time: were their chains to hold every multiprocessor, no front could run and every chain
// would wait forever. So a pipeline asks here before each one-launch chain: admitted while the blocks
// of the chains in flight, its own included, stay within `limit` (chunkwise_windows.cu: half the
// multiprocessors); else it runs that chain a launch per window, which never waits on another kernel.
// A chain counts from its admission until its `done` says so (cudaEventQuery of an event recorded
// after it: armed once launched) or its owner is released (the pipeline's destructor).
// Plain C++ (the completion test is a callback), so that the rule is tested without a GPU
// (tests/cuda/test_cuda_backend.cpp); the GPU case is tests/cuda/test_cuda_kda_chain.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace kcp::cuda {

class SpinningChains {
 public:
  using Done = std::function<bool()>;  // whether the chain has finished; called under the lock

  // Admits owner's chain of `blocks` on `device` when those blocks and the other owners' chains in
  // flight on it stay within `limit`, and then counts it (in place of owner's earlier chain, which its
  // own stream orders before this one) until launched(owner, done) and done() is true. Returns false
  // (nothing recorded) otherwise.
  bool admit(int device, const void* owner, int64_t blocks, int64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t others = 0;
    for (Entry& e : entries_)
      if (e.device == device && e.owner != owner && !finished(e)) others += e.blocks;
    if (blocks + others > limit) return false;
    forget_locked(owner);
    entries_.push_back({device, owner, blocks, {}});
    return true;
  }
  // The admitted chain of owner is queued; done() tells when it has finished (until then it counts).
  void launched(const void* owner, Done done) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_)
      if (e.owner == owner) e.done = std::move(done);
  }
  // Blocks of the chains on `device` in flight (other owners' and owner's own).
  int64_t in_flight(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (Entry& e : entries_)
      if (e.device == device && !finished(e)) n += e.blocks;
    return n;
  }
  void release(const void* owner) {  // the owner is going away (before its events are destroyed)
    std::lock_guard<std::mutex> lock(mu_);
    forget_locked(owner);
  }
  static SpinningChains& process() {  // the record every pipeline of this process shares
    static SpinningChains chains;
    return chains;
  }

 private:
  struct Entry {
    int device;
    const void* owner;
    int64_t blocks;
    Done done;  // empty: admitted, not yet queued (it counts)
  };
  static bool finished(const Entry& e) { return e.done && e.done(); }
  void forget_locked(const void* owner) {
    std::erase_if(entries_, [owner](const Entry& e) { return e.owner == owner; });
  }
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace kcp::cuda
