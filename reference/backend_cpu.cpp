// CpuBackend: dispatches the interface calls to the drivers with the chosen per-head core and the
// requested precision.
#include "reference/backend_cpu.h"

#include "core/transition.h"
#include "reference/chunkwise.h"
#include "reference/conv1d.h"
#include "reference/driver.h"
#include "reference/recurrent.h"

namespace kcp::ref {
namespace {

// Calls f(n, (S_ext, M) views of element i) for each sequence n = seq_begin + i of a packed buffer
// (M empty for a buffer that holds the S part alone: transition_backward's allow_s_only).
template <class F>
void for_each_transition(const Problem& p, int64_t seq_begin, const TensorView& packed, const char* what,
                         bool allow_s_only, F f) {
  const int64_t count = check_transition_call(p, seq_begin, packed, Device::host, what, allow_s_only);
  const bool s_only = transition_s_only(p, packed);
  for (int64_t i = 0; i < count; ++i) {
    const TensorView e = transition_element(packed, i);
    f(seq_begin + i, s_only ? Transition{e, {}} : Transition{transition_s(e), transition_m(e)});
  }
}

template <class Core>
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  Support supports(const Problem& p) const override {
    if (p.compute != DType::f64 && p.compute != DType::f32)
      return Support::no("compute must be float64 or float32");
    if constexpr (requires { Core::unsupported(p); }) {  // a core with its own limits (chunk sizes)
      std::string why = Core::unsupported(p);
      if (!why.empty()) return Support::no(std::move(why));
    }
    return {};
  }
  void forward(const Problem& p, const Inputs& in, const Outputs& out) override {
    require_support(*this, p);
    if (p.compute == DType::f64) drive_forward<double>(core_, p, in, out);
    else drive_forward<float>(core_, p, in, out);
  }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) override {
    require_support(*this, p);
    if (p.compute == DType::f64) drive_backward<double>(core_, p, in, d, gr);
    else drive_backward<float>(core_, p, in, d, gr);
  }
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) override {
    require_support(*this, p);
    for_each_transition(p, seq_begin, packed, "transition_forward", false, [&](int64_t n, const Transition& tr) {
      if (p.compute == DType::f64) drive_transition_forward<double>(core_, p, in, n, tr);
      else drive_transition_forward<float>(core_, p, in, n, tr);
    });
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                           const TensorView& packed) override {
    require_support(*this, p);
    for_each_transition(p, seq_begin, packed, "transition_backward", true, [&](int64_t n, const Transition& tr) {
      if (p.compute == DType::f64) drive_transition_backward<double>(core_, p, in, d_o, n, tr);
      else drive_transition_backward<float>(core_, p, in, d_o, n, tr);
    });
  }
  void conv1d_forward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& y) override {
    ref::conv1d_forward(p, t.x, t.weight, t.bias, t.halo, y);
  }
  void conv1d_backward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& dy,
                       const Conv1dGrads& g) override {
    ref::conv1d_backward(p, t.x, t.weight, t.bias, t.halo, dy, g.dx, g.dweight, g.dbias, g.dhalo);
  }
  Queue& queue() const override { return host_queue(); }

 private:
  std::string_view name_;
  Core core_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(CpuAlgorithm algorithm) {
  switch (algorithm) {
    case CpuAlgorithm::recurrent: return std::make_unique<CpuBackend<RecurrentCore>>("cpu-recurrent");
    case CpuAlgorithm::chunkwise: return std::make_unique<CpuBackend<ChunkwiseCore>>("cpu-chunkwise");
  }
  throw Error("make_cpu_backend: unknown CpuAlgorithm");
}

}  // namespace kcp::ref
