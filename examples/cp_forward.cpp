// Context parallelism from an installed kcp: `mpirun -np P cp_forward` splits the tiny problem's
// 100 packed tokens into P equal parts; each rank runs the CP forward on its part (transition,
// exchange, merge, local pass: cp/context_parallel.h) and compares its slice of o with the
// single-process float64 forward. Exit status 1 on any rank if they disagree beyond 1e-10.
#include <cmath>
#include <cstdio>

#include <kcp/cp/comm_mpi.h>
#include <kcp/cp/context_parallel.h>
#include <kcp/reference/backend_cpu.h>
#include "tiny_problem.h"

int main() try {
  kcp::cp::MpiSession mpi;
  const std::unique_ptr<kcp::cp::Comm> comm = kcp::cp::make_mpi_comm();
  const TinyProblem tp;
  const kcp::Inputs whole = tp.inputs();
  const std::unique_ptr<kcp::Backend> backend = kcp::ref::make_cpu_backend(kcp::ref::CpuAlgorithm::chunkwise);

  kcp::cp::CpOptions opt;
  opt.problem.cu_seqlens = tp.cu_seqlens;  // global; the parts default to equal ones
  kcp::cp::ContextParallel cp(*comm, *backend, kcp::Variant::gdn, kcp::Flags{}, opt);
  const kcp::cp::CpContext& ctx = cp.context();

  kcp::Inputs part = whole;  // this rank's tokens [lo, hi) of every per-token input
  for (kcp::TensorView* t : {&part.q, &part.k, &part.v, &part.g, &part.beta}) *t = t->narrow(1, ctx.lo, ctx.tokens());
  kcp::Tensor<double> o_part({1, ctx.tokens(), TinyProblem::H, TinyProblem::V});
  cp.forward(part, {o_part.view(), {}});

  kcp::ProblemOptions single;
  single.cu_seqlens = tp.cu_seqlens;
  const kcp::Problem p = kcp::make_problem(kcp::Variant::gdn, whole, kcp::Flags{}, single);
  kcp::Tensor<double> o({1, p.T, p.HV, p.V});
  backend->forward(p, whole, {o.view(), {}});
  double diff = 0;
  const int64_t row = p.HV * p.V;
  for (int64_t i = 0; i < o_part.numel(); ++i) diff = std::fmax(diff, std::fabs(o_part.data()[i] - o.data()[ctx.lo * row + i]));
  std::printf("%s: max |o_cp - o| = %.3g\n", ctx.describe().c_str(), diff);
  return diff <= 1e-10 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cp_forward: %s\n", e.what());
  return 2;
}
