// Stands in for comm_nccl.cpp in builds without NCCL (see comm_device.h).
#include "core/error.h"
#include "cp/comm_device.h"

namespace kcp::cp {

bool nccl_available() { return false; }

std::unique_ptr<Comm> make_nccl_comm(Comm&, Queue&) {
  throw Error("nccl comm: this build has no NCCL (NCCL was not found when kcp was configured)");
}

}  // namespace kcp::cp
