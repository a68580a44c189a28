// A CP job in which rank 1 misbehaves while the other ranks wait in the exchange:
//   cp_fault_job [throw|stop] [BACKEND] [auto|mpi|nccl]
//   throw (default): rank 1 throws inside its transition (or, as the last rank, its local forward);
//                    run_mpi_command must abort the whole job
//                    with rank 1's message (fault_test.sh; scripts/gpu.sh on cuda-chunkwise, both comms)
//   stop:            rank 1 stops itself (SIGSTOP) before the exchange; the communicator watchdog of the
//                    waiting ranks must end the job (watchdog_test.sh, KCP_CP_TIMEOUT set short)
// The scripts run it under mpirun with a time limit and fail if the job hangs, exits 0 or loses the message.
#include <csignal>
#include <string>

#include "cp/comm_device.h"
#include "cp/comm_mpi.h"
#include "cp/context_parallel.h"
#include "core/forwarding_backend.h"
#include "validation/cases.h"
#include "validation/mirror.h"
#include "validation/registry.h"

using namespace kcp;

namespace {

class FaultyBackend final : public ForwardingBackend {
 public:
  FaultyBackend(std::unique_ptr<Backend> b, bool fail, bool stop)
      : ForwardingBackend(std::move(b)), fail_(fail), stop_(stop) {}
  void transition_forward(const Problem& p, const Inputs& in, int64_t s, const TensorView& t) override {
    if (fail_ && stop_) std::raise(SIGSTOP);
    KCP_CHECK(!fail_, "injected fault in transition_forward");
    ForwardingBackend::transition_forward(p, in, s, t);
  }
  // The last rank of a job computes no transition (its last sequence ends there): it fails in its
  // local pass instead, so the 2-rank job (one GPU per rank under NCCL) has a fault too.
  void forward(const Problem& p, const Inputs& in, const Outputs& out) override {
    KCP_CHECK(!fail_, "injected fault in forward");
    ForwardingBackend::forward(p, in, out);
  }

 private:
  bool fail_, stop_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw", backend = argc > 2 ? argv[2] : "cpu-recurrent";
  const std::string comm = argc > 3 ? argv[3] : "auto";
  return cp::run_mpi_command("cp_fault_job", [&](cp::Comm& w) {
    val::CaseSpec s;
    s.seqlens = {80 * w.size()}, s.K = s.V = 32, s.H = s.HV = 1;
    const val::CaseData c = val::make_case(s);
    const int gpus = val::gpu_count();
    val::BackendOptions bo;
    bo.device = gpus > 0 ? cp::local_rank() % gpus : -1;
    FaultyBackend be(val::backend_create(backend, bo), w.rank() == 1, mode == "stop");
    const cp::DataComm data = cp::make_data_comm(w, be.queue(), cp::comm_kind_parse(comm), gpus);
    ProblemOptions po;
    po.cu_seqlens = c.cu_seqlens, po.compute = DType::f32;
    cp::ContextParallel cp(data.get(), be, s.variant, s.flags, {po, {}, cp::MergeAlgorithm::linear});
    const int64_t lo = cp.context().lo, n = cp.context().tokens();
    val::DeviceMirror dev(be);
    Inputs in = c.inputs();
    for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) *t = dev.input(t->narrow(1, lo, n), DType::f32);
    for (TensorView* t : {&in.initial_state, &in.A_log, &in.dt_bias}) *t = dev.input(*t, DType::f32);  // whole
    Tensor<float> o({1, n, 1, 32}), ht(c.h0.shape());
    cp.forward(in, {dev.output(o.view()), dev.output(ht.view())});
    dev.download();
    return 0;
  });
}
