// run_op_call / run_conv1d_call: stage, run, read back (see dump_runner.h).
#include "validation/dump_runner.h"

#include <new>
#include <sstream>
#include <vector>

#include "io/limits.h"

#include "reference/conv1d.h"

namespace kcp::val {
namespace {

// Copies of host tensors in a backend's memory, and output buffers read back by collect().
class Staging {
 public:
  Staging(Backend& b, std::string file) : be_(b), file_(std::move(file)) {}

  TensorView in(const TensorView& host, const char* name) {  // an empty (absent) input stays empty
    if (host.empty()) return {};
    KCP_CHECK(host.contiguous() && host.device == Device::host, "staging: inputs must be contiguous host views");
    const size_t bytes = size_t(io::checked_bytes(host.shape, dtype_size(host.dtype), file_ + ": /inputs/" + name));
    void* dst = buffer(bytes, name);
    if (bytes) be_.queue().copy(dst, host.data, bytes, CopyKind::host_to_device);
    be_.synchronize();  // host.data may be freed by the caller afterwards
    return TensorView(dst, host.dtype, host.shape, be_.device());
  }

  TensorView out(const std::string& name, DType t, const Shape& s) {
    const size_t bytes = size_t(io::checked_bytes(s, dtype_size(t), file_ + ": result " + name));
    void* dst = buffer(bytes, name.c_str());
    outs_.push_back({name, t, s, dst});
    return TensorView(dst, t, s, be_.device());
  }

  Results collect() {
    be_.synchronize();
    Results r;
    for (const Out& o : outs_) {
      io::Array a(o.dtype, o.shape);
      if (a.nbytes()) be_.queue().copy(a.data(), o.ptr, a.nbytes(), CopyKind::device_to_host);
      r[o.name] = std::move(a);
    }
    be_.synchronize();
    return r;
  }

 private:
  struct Out {
    std::string name;
    DType dtype;
    Shape shape;
    void* ptr;
  };
  // Never a null pointer, even for zero elements: a null view means "absent" to the backends.
  void* buffer(size_t bytes, const char* name) {
    try {
      bufs_.emplace_back(be_.queue(), std::max<size_t>(bytes, 8));
    } catch (const std::bad_alloc&) {
      throw Error(file_ + ": " + name + ": cannot allocate " + io::bytes_str(double(bytes)) + " on " +
                  std::string(be_.name()) + " (out of memory)");
    }
    return bufs_.back().get();
  }
  Backend& be_;
  std::string file_;
  std::vector<DeviceBuffer> bufs_;
  std::vector<Out> outs_;
};

Grads grad_outputs(Staging& st, const Problem& p, const Inputs& in) {
  Grads g;
  const DType c = p.compute;
  g.dq = st.out("dq", c, shape_qk(p)), g.dk = st.out("dk", c, shape_qk(p)), g.dv = st.out("dv", c, shape_v(p));
  g.dg = st.out("dg", c, shape_g(p));
  if (p.delta_rule()) g.dbeta = st.out("dbeta", c, shape_beta(p));
  if (!in.initial_state.empty()) g.d_initial_state = st.out("dinitial_state", c, shape_state(p));
  if (!in.A_log.empty()) g.dA_log = st.out("dA_log", c, {p.HV});
  if (!in.dt_bias.empty()) g.ddt_bias = st.out("ddt_bias", c, shape_dt_bias(p));
  return g;
}

}  // namespace

Results run_op_call(Backend& be, const io::OpCall& call, std::string* backward_skipped) {
  const Problem& p = call.problem;
  require_support(be, p);
  Staging st(be, call.path);
  const Inputs& h = call.inputs;
  const Inputs in{st.in(h.q, "q"), st.in(h.k, "k"), st.in(h.v, "v"), st.in(h.g, "g"), st.in(h.beta, "beta"),
                  st.in(h.A_log, "A_log"), st.in(h.dt_bias, "dt_bias"), st.in(h.initial_state, "initial_state")};
  const Outputs out{st.out("o", p.compute, shape_v(p)), st.out("final_state", p.compute, shape_state(p))};
  be.forward(p, in, out);
  if (!call.cotangents.d_o.empty()) {
    if (const Support bwd = be.supports_backward(p); bwd) {
      const Cotangents d{st.in(call.cotangents.d_o, "do"), st.in(call.cotangents.d_final_state, "dht")};
      be.backward(p, in, d, grad_outputs(st, p, in));
    } else if (backward_skipped) {
      *backward_skipped = bwd.reason;
    }
  }
  return st.collect();
}

namespace {

ref::Conv1dProblem conv1d_problem(const io::Conv1dCall& c, DType compute) {
  try {
    ref::Conv1dProblem p = ref::make_conv1d_problem(c.x, c.weight, c.bias, c.cu_seqlens, c.silu, {}, compute);
    KCP_CHECK(c.dy.empty() || c.dy.shape == c.x.shape, "dy: expected the shape of x ", shape_str(c.x.shape),
              ", got ", shape_str(c.dy.shape));
    return p;
  } catch (const Error& e) {
    throw Error(c.path + ": /inputs/" + e.what());  // the reference's messages start with the tensor's name
  }
}

}  // namespace

std::string describe_conv1d_call(const io::Conv1dCall& c) {
  (void)conv1d_problem(c, DType::f64);
  std::ostringstream os;
  os << "conv1d(x=" << shape_str(c.x.shape) << ",W=" << c.weight.dim(1) << (c.bias.empty() ? "" : ",bias")
     << (c.cu_seqlens.empty() ? "" : ",varlen") << (c.silu ? ",silu" : "") << ")";
  return os.str();
}

Results run_conv1d_call(const io::Conv1dCall& c, DType compute) {
  const ref::Conv1dProblem p = conv1d_problem(c, compute);
  Results r;
  r["y"] = io::Array(compute, c.x.shape);
  ref::conv1d_forward(p, c.x, c.weight, c.bias, {}, r["y"].view());
  if (!c.dy.empty()) {
    r["dx"] = io::Array(compute, c.x.shape);
    r["dweight"] = io::Array(compute, c.weight.shape);
    if (!c.bias.empty()) r["dbias"] = io::Array(compute, c.bias.shape);
    ref::conv1d_backward(p, c.x, c.weight, c.bias, {}, c.dy, r["dx"].view(), r["dweight"].view(),
                         c.bias.empty() ? TensorView{} : r["dbias"].view(), {});
  }
  return r;
}

DumpRun run_dump(Backend& be, const io::Dump& d, DType compute) {
  DumpRun r;
  if (d.op == "conv1d") {
    const io::Conv1dCall c = io::dump_conv1d_call(d);
    r.results = run_conv1d_call(c, compute);
    r.group = "conv1d-reference";
    std::ostringstream os;
    os << "conv1d(x=" << shape_str(c.x.shape) << ",W=" << c.weight.dim(1) << (c.bias.empty() ? "" : ",bias")
       << (c.cu_seqlens.empty() ? "" : ",varlen") << (c.silu ? ",silu" : "") << "," << dtype_name(compute)
       << ") on the conv1d reference";
    r.description = os.str(), r.input_dtype = c.input_dtype, r.placement = c.placement;
    return r;
  }
  const io::OpCall c = io::dump_op_call(d, compute);
  r.results = run_op_call(be, c, &r.backward_skipped);
  r.group = std::string(be.name());
  r.description = c.problem.describe() + " on " + r.group;
  r.input_dtype = c.input_dtype, r.placement = c.placement;
  return r;
}

io::DumpGroup results_group(const std::string& name, const Results& r, std::string_view backend, DType compute) {
  io::DumpGroup g;
  g.name = name;
  g.attrs["producer"] = std::string("kcp");
  g.attrs["backend"] = std::string(backend);
  g.attrs["compute"] = std::string(dtype_name(compute));
  for (const auto& [n, a] : r) g.add(n, a, a.dtype);
  return g;
}

}  // namespace kcp::val
