// CpuBackend: dispatches the interface calls to the drivers with the chosen per-head core and the
// requested precision.
#include "reference/backend_cpu.h"

#include "reference/chunkwise.h"
#include "reference/driver.h"
#include "reference/recurrent.h"

namespace kcp::ref {
namespace {

template <class Core>
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  Device device() const override { return Device::host; }
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
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq, const Transition& tr) override {
    require_support(*this, p);
    if (p.compute == DType::f64) drive_transition_forward<double>(core_, p, in, seq, tr);
    else drive_transition_forward<float>(core_, p, in, seq, tr);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq,
                           const Transition& tr) override {
    require_support(*this, p);
    if (p.compute == DType::f64) drive_transition_backward<double>(core_, p, in, d_o, seq, tr);
    else drive_transition_backward<float>(core_, p, in, d_o, seq, tr);
  }

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
