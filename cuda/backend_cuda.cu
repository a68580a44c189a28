// CudaChunkwiseBackend: the Backend interface over Pipeline (chunkwise.h) and the conv1d kernels
// (conv1d.cuh), on its own CudaQueue (queue_cuda.h).
// Covered by tests/cuda/test_cuda_backend.cpp.
#include "cuda/backend_cuda.h"

#include "cuda/chunkwise.h"
#include "cuda/conv1d.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device_guard.cuh"
#include "cuda/key_dims.h"

namespace kcp::cuda {
namespace {

// Views a call passes must be CUDA device views; checked before the queue is created, so the
// message names the argument on a machine without a GPU too.
void expect_device(const TensorView& t, const char* name) {
  KCP_CHECK(t.empty() || t.device == Device::cuda, "cuda-chunkwise: ", name,
            " must be a CUDA device view (stage it through the backend's queue)");
}

class CudaChunkwiseBackend final : public Backend {
 public:
  CudaChunkwiseBackend(const CudaQueueOptions& opt, const CudaBackendOptions& bopt) : opt_(opt), bopt_(bopt) {}

  std::string_view name() const override { return "cuda-chunkwise"; }
  Device device() const override { return Device::cuda; }
  // Created on first use: supports() answers on machines without a GPU; anything that needs the
  // device throws "no CUDA device" there.
  Queue& queue() const override {
    if (!queue_) queue_ = make_cuda_queue(opt_);
    return *queue_;
  }

  Support supports(const Problem& p) const override {
    if (p.chunk_size != 64) return Support::no(detail::concat("chunk_size ", p.chunk_size, ": the kernels use 64"));
    if (!key_dim_supported(p.K)) return Support::no(detail::concat("K = ", p.K, ": instantiated for K = 32, 64, 128"));
    if (p.V % kValueTile != 0) return Support::no(detail::concat("V = ", p.V, ": must be a multiple of ", kValueTile));
    if (p.compute != DType::f32) return Support::no("computes in float32 only (ask for compute = float32)");
    return {};
  }
  Support supports_backward(const Problem& p) const override {
    return supports(p);
  }
  Support supports_conv1d(const Conv1dProblem& p) const override {
    if (p.W > 8) return Support::no(detail::concat("conv1d W = ", p.W, ": the kernels take W <= 8"));
    return {};
  }

  void forward(const Problem& p, const Inputs& in, const Outputs& out) override {
    require_support(*this, p);
    for (auto [v, n] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.g, "g"}, {&in.beta, "beta"},
                        {&out.o, "o"}, {&out.final_state, "final_state"}})
      expect_device(*v, n);
    pipeline().forward(p, in, out);
  }
  // The kernels the last forward (or transition_forward) picked (Pipeline::last_forward); empty before the first.
  std::string explain_last_forward() const override {
    return pipeline_ && *pipeline_->last_forward().state ? pipeline_->last_forward().describe() : std::string();
  }
  void backward(const Problem& p, const Inputs& in, const Cotangents& d, const Grads& gr) override {
    require_backward_support(*this, p);
    for (auto [v, n] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.g, "g"}, {&in.beta, "beta"},
                        {&d.d_o, "d_o"}, {&d.d_final_state, "d_final_state"}, {&gr.dq, "dq"}, {&gr.dk, "dk"},
                        {&gr.dv, "dv"}, {&gr.dg, "dg"}, {&gr.dbeta, "dbeta"}, {&gr.d_initial_state, "d_initial_state"},
                        {&gr.dA_log, "dA_log"}, {&gr.ddt_bias, "ddt_bias"}})
      expect_device(*v, n);
    pipeline().backward(p, in, d, gr);
  }
  void forward_prepare(const Problem& p, const Inputs& in) override {
    if (!supports(p)) return;  // the forward will say why
    expect_device(in.q, "q");
    pipeline().forward_prepare(p, in);
  }
  void backward_prepare(const Problem& p, const Inputs& in, const TensorView& d_o) override {
    if (!supports_backward(p)) return;  // the backward will say why
    expect_device(in.q, "q"), expect_device(d_o, "d_o");
    KCP_CHECK(d_o.shape == shape_v(p), "backward_prepare: d_o: expected shape ", shape_str(shape_v(p)), ", got ",
              shape_str(d_o.shape));
    pipeline().backward_prepare(p, in, d_o);
  }
  // Without a pipeline there is no kept work to reuse; one made later starts with the check on.
  void set_inputs_unchanged(bool on) override {
    if (pipeline_) pipeline_->set_inputs_unchanged(on);
  }
  void transition_forward(const Problem& p, const Inputs& in, int64_t seq_begin, const TensorView& packed) override {
    require_support(*this, p);
    expect_device(in.q, "q"), expect_device(packed, "packed");
    pipeline().transition_forward(p, in, seq_begin, packed);
  }
  void transition_backward(const Problem& p, const Inputs& in, const TensorView& d_o, int64_t seq_begin,
                           const TensorView& packed) override {
    require_backward_support(*this, p);
    expect_device(in.q, "q"), expect_device(d_o, "d_o"), expect_device(packed, "packed");
    pipeline().transition_backward(p, in, d_o, seq_begin, packed);
  }

  void conv1d_forward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& y) override {
    check_conv(p);
    KCP_CHECK(y.shape == t.x.shape, "y: expected shape ", shape_str(t.x.shape), ", got ", shape_str(y.shape));
    expect_device(t.x, "x"), expect_device(y, "y");
    DeviceGuard g(queue().device_index());
    conv1d_launch_forward(p, t, y, queue_->native_stream(), upload_cu(p));
  }
  void conv1d_backward(const Conv1dProblem& p, const Conv1dTensors& t, const TensorView& dy,
                       const Conv1dGrads& gr) override {
    check_conv(p);
    KCP_CHECK(dy.shape == t.x.shape, "dy: expected shape ", shape_str(t.x.shape), ", got ", shape_str(dy.shape));
    KCP_CHECK(gr.dx.empty() || gr.dx.shape == t.x.shape, "dx: expected shape ", shape_str(t.x.shape));
    KCP_CHECK(gr.dweight.empty() || gr.dweight.shape == t.weight.shape, "dweight: expected shape ",
              shape_str(t.weight.shape));
    KCP_CHECK(gr.dbias.empty() || gr.dbias.shape == Shape{p.D}, "dbias: expected shape [D]");
    KCP_CHECK(gr.dhalo.empty() || gr.dhalo.shape == (Shape{p.halo, p.D}), "dhalo: expected shape [P,D]");
    expect_device(t.x, "x"), expect_device(dy, "dy");
    DeviceGuard g(queue().device_index());
    const int64_t* cu = upload_cu(p);
    const size_t dz_bytes = size_t(p.B * p.T * p.D) * (p.compute == DType::f64 ? 8 : 4);
    if (dz_bytes > scratch_.bytes()) scratch_ = DeviceBuffer(*queue_, dz_bytes);
    conv1d_launch_backward(p, t, dy, gr, queue_->native_stream(), cu, scratch_.get());
  }

 private:
  void check_conv(const Conv1dProblem& p) const {
    const Support s = supports_conv1d(p);
    KCP_CHECK(s.ok, "cuda-chunkwise: ", s.reason);
  }
  // cu_seqlens on the device, kept while it does not change (null for a dense batch).
  const int64_t* upload_cu(const Conv1dProblem& p) {
    if (p.cu_seqlens.empty()) return nullptr;
    if (p.cu_seqlens != cu_host_) {
      cu_host_ = p.cu_seqlens;
      const size_t bytes = sizeof(int64_t) * cu_host_.size();
      if (bytes > cu_dev_.bytes()) cu_dev_ = DeviceBuffer(*queue_, bytes);
      // pageable source: staged before copy() returns, so cu_host_ may change afterwards
      queue_->copy(cu_dev_.get(), cu_host_.data(), bytes, CopyKind::host_to_device);
    }
    return static_cast<const int64_t*>(cu_dev_.get());
  }

  Pipeline& pipeline() {
    if (!pipeline_) {
      pipeline_ = std::make_unique<Pipeline>(queue());
      pipeline_->set_keep_forward(bopt_.keep_forward);
    }
    return *pipeline_;
  }

  CudaQueueOptions opt_;
  CudaBackendOptions bopt_;
  mutable std::unique_ptr<Queue> queue_;
  std::unique_ptr<Pipeline> pipeline_;
  std::vector<int64_t> cu_host_;
  DeviceBuffer cu_dev_, scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaQueueOptions& opt, const CudaBackendOptions& bopt) {
  return std::make_unique<CudaChunkwiseBackend>(opt, bopt);
}

PadRule pad_rule() {
  return {"cuda-chunkwise", std::vector<int64_t>(std::begin(kKeyDims), std::end(kKeyDims)), kValueTile, 64, {16, 32}};
}

}  // namespace kcp::cuda
