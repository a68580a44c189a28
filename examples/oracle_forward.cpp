// The float64 oracle from an installed kcp: the token recurrence and the chunkwise algorithm on
// the same gdn problem, which must agree to ~1e-10 (ALGORITHMS.md; kcp's own tests hold them to it).
// Prints o[0, 0, 0, :4] and the largest difference; exit status 1 if they disagree.
#include <cmath>
#include <cstdio>

#include <kcp/core/backend.h>
#include <kcp/reference/backend_cpu.h>
#include "tiny_problem.h"

int main() try {
  const TinyProblem tp;
  const kcp::Inputs in = tp.inputs();
  kcp::ProblemOptions opt;
  opt.cu_seqlens = tp.cu_seqlens;
  const kcp::Problem p = kcp::make_problem(kcp::Variant::gdn, in, kcp::Flags{}, opt);
  std::printf("%s\n", p.describe().c_str());

  kcp::Tensor<double> o_rec({1, p.T, p.HV, p.V}), o_chunk({1, p.T, p.HV, p.V});
  kcp::ref::make_cpu_backend(kcp::ref::CpuAlgorithm::recurrent)->forward(p, in, {o_rec.view(), {}});
  kcp::ref::make_cpu_backend(kcp::ref::CpuAlgorithm::chunkwise)->forward(p, in, {o_chunk.view(), {}});
  double diff = 0;
  for (int64_t i = 0; i < o_rec.numel(); ++i) diff = std::fmax(diff, std::fabs(o_rec.data()[i] - o_chunk.data()[i]));
  std::printf("o[0,0,0,:4] = %.6f %.6f %.6f %.6f\nrecurrent vs chunkwise: max |diff| = %.3g\n",
              o_rec.data()[0], o_rec.data()[1], o_rec.data()[2], o_rec.data()[3], diff);
  return diff <= 1e-10 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "oracle_forward: %s\n", e.what());
  return 2;
}
