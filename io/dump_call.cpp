// Decoding a dump into the operator call it records (see dump_call.h).
#include "io/dump_call.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/conv1d.h"
#include "core/error.h"
#include "io/limits.h"

namespace kcp::io {
namespace {

const std::vector<std::string>& op_input_names() {
  static const std::vector<std::string> names = {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                                                 "do", "dht"};
  return names;
}

Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) idx[d] = i % shape[d], i /= shape[d];
  return idx;
}

// Copies /inputs/<name> into the call's tensors and returns a view of it; checks float + finite.
TensorView take(std::map<std::string, Array>& owned, const DumpGroup& in, const std::string& path,
                const std::string& name, bool required, const std::string& why) {
  const DumpDataset* ds = in.find(name);
  const std::string where = path + ": /inputs/" + name;
  KCP_CHECK(ds || !required, where, ": missing (", why, ")");
  if (!ds) return {};
  KCP_CHECK(dtype_is_float(ds->data.dtype), where, ": expected a floating-point tensor, got ",
            dtype_name(ds->data.dtype));
  const Tensor<double> x = to_tensor<double>(ds->data.view());
  for (int64_t i = 0; i < x.numel(); ++i)
    KCP_CHECK(std::isfinite(x.data()[i]), where, ": non-finite value ", x.data()[i], " at index ",
              shape_str(unravel(i, ds->data.shape)), " (inputs must be finite)");
  return (owned[name] = ds->data).view();
}

std::vector<int64_t> read_index_vector(const DumpDataset& ds, const std::string& where) {
  KCP_CHECK(!dtype_is_float(ds.data.dtype) && ds.data.shape.size() == 1, where,
            ": expected a 1-d integer tensor, got ", dtype_name(ds.data.dtype), " ", shape_str(ds.data.shape));
  KCP_CHECK(ds.data.numel() > 0, where, ": empty; packed sequences need [0, ..., T] (leave the dataset out for B "
            "separate sequences)");
  const Tensor<int64_t> t = to_tensor<int64_t>(ds.data.view());
  return t.vec();
}

std::vector<int64_t> op_cu_seqlens(const Dump& d, const DumpGroup& in, const Placement& pl, int64_t T_local) {
  const std::string where = d.path + ": /inputs/";
  if (const DumpDataset* loc = in.find("cu_seqlens_local")) return read_index_vector(*loc, where + "cu_seqlens_local");
  const DumpDataset* cu = in.find("cu_seqlens");
  if (!cu) return {};
  std::vector<int64_t> v = read_index_vector(*cu, where + "cu_seqlens");
  const std::string scope = attr_string(cu->attrs, "scope", where + "cu_seqlens", "local");
  if (scope == "global" && pl.cp_mode == "chunkwise" && pl.cp_rank >= 0)
    return local_cu_seqlens(v, pl.token_offset, pl.token_offset + T_local);
  return v;
}

Flags read_flags(const Dump& d, Variant var) {
  const Attributes& a = d.attrs;
  const std::string w = d.path + ":";
  Flags f;
  f.use_qk_l2norm_in_kernel = attr_flag(a, "use_qk_l2norm_in_kernel", w, false);
  f.use_beta_sigmoid_in_kernel = attr_flag(a, "use_beta_sigmoid_in_kernel", w, false);
  f.allow_neg_eigval = attr_flag(a, "allow_neg_eigval", w, false);
  f.use_gate_in_kernel = attr_flag(a, "use_gate_in_kernel", w, false);
  f.safe_gate = attr_flag(a, "safe_gate", w, false);
  const double lb = attr_number(a, "lower_bound", w, NAN);  // NaN: None in Python
  if (!std::isnan(lb)) f.lower_bound = lb;
  const std::string layout = attr_string(a, "state_layout", w, "KV");
  KCP_CHECK(layout == "KV" || layout == "VK", d.path, ": attribute state_layout: expected 'KV' or 'VK', got '",
            layout, "'");
  f.state_v_first = layout == "VK";
  (void)var;
  return f;
}

// make_problem's messages start with the argument's name; point them at the dataset.
[[noreturn]] void rethrow_in_file(const std::string& path, const Error& e) {
  const std::string msg = e.what();
  for (const std::string& n : op_input_names()) {
    if (msg.rfind(n + ":", 0) == 0) throw Error(path + ": /inputs/" + msg);
  }
  for (const char* n : {"cu_seqlens", "d_initial_state"})
    if (msg.rfind(std::string(n) + ":", 0) == 0) throw Error(path + ": /inputs/" + msg);
  for (const char* n : {"lower_bound", "safe_gate", "scale", "chunk_size", "allow_neg_eigval"})
    if (msg.rfind(std::string(n) + ":", 0) == 0) throw Error(path + ": attribute " + msg);
  throw Error(path + ": " + msg);
}

// Version 2 files may state the sizes; they must agree with the tensors.
void check_size_attrs(const Dump& d, const Problem& p) {
  const std::pair<const char*, int64_t> sizes[] = {{"B", p.B}, {"T", p.T}, {"H", p.H}, {"HV", p.HV},
                                                   {"K", p.K}, {"V", p.V}, {"N", p.N}};
  for (auto [key, value] : sizes) {
    const int64_t stated = attr_int(d.attrs, key, d.path + ":", value);
    KCP_CHECK(stated == value, d.path, ": attribute ", key, " = ", stated, " contradicts the tensors (",
              key, " = ", value, " from /inputs: ", p.describe(), ")");
  }
}

// /inputs/<name> as a group instead of a dataset, and required tensors with no elements (T = 0).
void check_input_objects(const Dump& d, const std::vector<std::string>& required) {
  std::vector<std::string> names = op_input_names();
  names.insert(names.end(), {"cu_seqlens", "cu_seqlens_local", "x", "weight", "bias", "dy"});
  for (const DumpGroup& g : d.groups)
    KCP_CHECK(!(g.name.rfind("inputs/", 0) == 0 && std::find(names.begin(), names.end(), g.name.substr(7)) != names.end()),
              d.path, ": /", g.name, ": a group, expected a dataset (a tensor)");
  const DumpGroup& in = d.inputs();
  for (const std::string& n : required)
    if (const DumpDataset* ds = in.find(n))
      KCP_CHECK(ds->data.numel() > 0, d.path, ": /inputs/", n, ": shape ", shape_str(ds->data.shape),
                " has no elements (", ds->data.shape.size() > 1 && ds->data.shape[1] == 0 ? "T = 0 tokens" : "a size is 0",
                "); kcp checks calls with at least one token");
}

int64_t read_chunk_size(const Dump& d) {
  const int64_t C = attr_int(d.attrs, "chunk_size", d.path + ":", 64);
  KCP_CHECK(C >= 1 && C <= 1024 && (C & (C - 1)) == 0, d.path, ": attribute chunk_size: expected a power of two "
            "from 1 to 1024 (FLA's chunk sizes are 16, 32, 64), got ", C);
  return C;
}

std::optional<double> read_scale(const Dump& d) {
  if (!attr_find(d.attrs, "scale")) return std::nullopt;
  const double scale = attr_number(d.attrs, "scale", d.path + ":", NAN);
  KCP_CHECK(std::isfinite(scale) && scale > 0, d.path, ": attribute scale: must be positive and finite, got ", scale,
            " (leave it out for the default K^-0.5)");
  return scale;
}

// Every tensor the decoded call makes kcp allocate, from sizes checked for overflow, against the
// memory limit: outputs, states, gradients, the chunkwise backends' per-chunk states, and the
// staged copies of the inputs.
void check_derived_sizes(const OpCall& c) {
  const Problem& p = c.problem;
  MemoryBudget b{c.path};
  const int64_t e = dtype_size(p.compute);
  auto add = [&](const char* what, const Shape& s, const char* dims) {
    const std::string w = c.path + ": " + what + " " + dims;
    b.add(what, checked_bytes(s, e, w), std::string(dims) + " = " + shape_str(s) + " " + std::string(dtype_name(p.compute)));
  };
  const int64_t chunks = (p.T + p.chunk_size - 1) / p.chunk_size;
  int64_t state_rows = 0;
  KCP_CHECK(!__builtin_add_overflow(chunks, p.N, &state_rows), c.path, ": chunk count overflows");
  add("the output o", {p.B, p.T, p.HV, p.V}, "[B,T,HV,V]");
  add("the final state", {p.N, p.HV, p.K, p.V}, "[N,HV,K,V]");
  add("the per-chunk states", {state_rows, p.HV, p.K, p.V}, "[T/C+N,HV,K,V]");
  for (const auto& [name, a] : c.tensors)
    b.add("the staged copy of /inputs/" + name, checked_bytes(a.shape, 8, c.path + ": /inputs/" + name));
  if (c.cotangents.d_o.empty()) return;
  add("the gradients dq, dk", {2 * p.B, p.T, p.H, p.K}, "2x[B,T,H,K]");
  add("the gradient dv", {p.B, p.T, p.HV, p.V}, "[B,T,HV,V]");
  add("the gradient dg", {p.B, p.T, p.HV, p.per_channel_gate() ? p.K : 1}, "[B,T,HV(,K)]");
  add("the gradient dinitial_state", {p.N, p.HV, p.K, p.V}, "[N,HV,K,V]");
}

}  // namespace

std::vector<int64_t> local_cu_seqlens(const std::vector<int64_t>& cu, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t c : cu) {
    const int64_t x = std::clamp(c, lo, hi) - lo;
    if (out.empty() || out.back() != x) out.push_back(x);
  }
  if (out.size() == 1) out.push_back(out[0]);
  return out;
}

std::string Placement::describe() const {
  if (tp_size == 1 && cp_size == 1) return "single rank";
  std::ostringstream os;
  os << "tp " << tp_rank << "/" << tp_size << ", cp " << cp_rank << "/" << cp_size << " " << cp_mode;
  if (cp_mode == "chunkwise") os << ", tokens from " << token_offset;
  if (head_offset) os << ", heads from " << head_offset;
  return os.str();
}

Placement dump_placement(const Dump& d) {
  const Attributes& a = d.attrs;
  const std::string w = d.path + ":";
  Placement p;
  p.tp_size = attr_int(a, "tp_size", w, 1), p.tp_rank = attr_int(a, "tp_rank", w, 0);
  p.cp_size = attr_int(a, "cp_size", w, 1), p.cp_rank = attr_int(a, "cp_rank", w, 0);
  p.cp_mode = attr_string(a, "cp_mode", w, p.cp_size > 1 ? "" : "none");
  p.cp_partition = attr_string(a, "cp_partition", w, "");
  p.head_offset = attr_int(a, "head_offset", w, 0), p.token_offset = attr_int(a, "token_offset", w, 0);
  p.pre_num_ranks = attr_int(a, "cp_pre_num_ranks", w, 0), p.post_num_ranks = attr_int(a, "cp_post_num_ranks", w, 0);
  p.pre_num_conv_tokens = attr_int(a, "cp_pre_num_conv_tokens", w, 0);
  p.is_first_rank = attr_flag(a, "cp_is_first_rank", w, p.pre_num_ranks == 0);
  p.is_last_rank = attr_flag(a, "cp_is_last_rank", w, p.post_num_ranks == 0);
  KCP_CHECK(p.tp_size >= 1 && p.tp_rank >= 0 && p.tp_rank < p.tp_size, d.path,
            ": attributes tp_rank/tp_size: need 0 <= tp_rank < tp_size, got ", p.tp_rank, "/", p.tp_size);
  KCP_CHECK(p.cp_size >= 1 && p.cp_rank >= -1 && p.cp_rank < p.cp_size, d.path,
            ": attributes cp_rank/cp_size: need -1 <= cp_rank < cp_size, got ", p.cp_rank, "/", p.cp_size);
  KCP_CHECK(p.cp_mode == "none" || p.cp_mode == "headwise" || p.cp_mode == "chunkwise", d.path,
            ": attribute cp_mode: expected none, headwise or chunkwise, got '", p.cp_mode, "'");
  KCP_CHECK(p.head_offset >= 0 && p.token_offset >= 0, d.path, ": attributes head_offset/token_offset must be >= 0");
  return p;
}

OpCall dump_op_call(const Dump& d, DType compute) {
  OpCall c;
  c.path = d.path;
  const Variant var = variant_parse(d.op);
  const DumpGroup& in = d.inputs();
  const std::string why = "a " + d.op + " dump needs q, k, v, g" + (var == Variant::gla ? "" : ", beta");
  check_input_objects(d, {"q", "k", "v", "g", "beta"});
  Inputs& x = c.inputs;
  x.q = take(c.tensors, in, d.path, "q", true, why), x.k = take(c.tensors, in, d.path, "k", true, why);
  x.v = take(c.tensors, in, d.path, "v", true, why), x.g = take(c.tensors, in, d.path, "g", true, why);
  x.beta = take(c.tensors, in, d.path, "beta", var != Variant::gla, why);
  x.A_log = take(c.tensors, in, d.path, "A_log", false, "");
  x.dt_bias = take(c.tensors, in, d.path, "dt_bias", false, "");
  x.initial_state = take(c.tensors, in, d.path, "initial_state", false, "");
  c.cotangents.d_o = take(c.tensors, in, d.path, "do", false, "");
  c.cotangents.d_final_state = take(c.tensors, in, d.path, "dht", false, "");
  c.placement = dump_placement(d);
  ProblemOptions opt;
  opt.compute = compute;
  opt.chunk_size = read_chunk_size(d);
  opt.scale = read_scale(d);
  opt.check_finite = false;  // done above, with the dataset's name
  try {
    KCP_CHECK(x.q.rank() == 4, "q: expected shape [B,T,H,K], got ", shape_str(x.q.shape));
    opt.cu_seqlens = op_cu_seqlens(d, in, c.placement, x.q.dim(1));
    c.problem = make_problem(var, x, read_flags(d, var), opt);
    if (!c.cotangents.d_o.empty()) check_cotangents(c.problem, c.cotangents);
    KCP_CHECK(c.cotangents.d_o.empty() ? c.cotangents.d_final_state.empty() : true,
              "dht: given without do (the backward pass needs do)");
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(d.path, 0) == 0) throw;
    rethrow_in_file(d.path, e);
  }
  check_size_attrs(d, c.problem);
  check_derived_sizes(c);
  const std::string idt = attr_string(d.attrs, "input_dtype", d.path + ":", "");
  c.input_dtype = idt.empty() ? in.find("q")->source : dtype_parse(idt);
  return c;
}

Conv1dCall dump_conv1d_call(const Dump& d) {
  Conv1dCall c;
  c.path = d.path;
  const DumpGroup& in = d.inputs();
  const std::string why = "a conv1d dump needs x and weight";
  check_input_objects(d, {"x", "weight"});
  c.x = take(c.tensors, in, d.path, "x", true, why);
  c.weight = take(c.tensors, in, d.path, "weight", true, why);
  if (c.weight.rank() == 3 && c.weight.dim(1) == 1)  // Megatron's conv1d.weight [D,1,W]
    c.weight = TensorView(c.weight.data, c.weight.dtype, {c.weight.dim(0), c.weight.dim(2)});
  c.bias = take(c.tensors, in, d.path, "bias", false, "");
  c.dy = take(c.tensors, in, d.path, "dy", false, "");
  KCP_CHECK(c.x.rank() == 3, d.path, ": /inputs/x: expected shape [B,T,D], got ", shape_str(c.x.shape));
  if (const DumpDataset* cu = in.find("cu_seqlens"))
    c.cu_seqlens = read_index_vector(*cu, d.path + ": /inputs/cu_seqlens");
  const std::string act = attr_string(d.attrs, "activation", d.path + ":", "swish");
  KCP_CHECK(act == "swish" || act == "silu" || act == "identity" || act == "none", d.path,
            ": attribute activation: expected swish, silu, identity or none, got '", act, "'");
  c.silu = act == "swish" || act == "silu";
  const int64_t W = attr_int(d.attrs, "kernel_size", d.path + ":", c.weight.rank() == 2 ? c.weight.dim(1) : -1);
  KCP_CHECK(c.weight.rank() == 2 && c.weight.dim(1) == W, d.path, ": /inputs/weight: expected shape [D,W] with W = ",
            "kernel_size = ", W, ", got ", shape_str(c.weight.shape));
  c.placement = dump_placement(d);
  try {  // the whole call, as the reference will see it (bias, dy, cu_seqlens)
    make_conv1d_problem(c.x, c.weight, c.bias, c.cu_seqlens, c.silu, {});
    KCP_CHECK(c.dy.empty() || c.dy.shape == c.x.shape, "dy: expected the shape of x ", shape_str(c.x.shape),
              ", got ", shape_str(c.dy.shape));
  } catch (const Error& e) {
    throw Error(d.path + ": /inputs/" + e.what());  // the messages start with the tensor's name
  }
  const std::string idt = attr_string(d.attrs, "input_dtype", d.path + ":", "");
  c.input_dtype = idt.empty() ? in.find("x")->source : dtype_parse(idt);
  return c;
}

bool result_name_known(std::string_view op, std::string_view name) {
  if (op == "conv1d") return name == "y" || name == "dx" || name == "dweight" || name == "dbias";
  for (std::string_view n :
       {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias"})
    if (n == name) return true;
  return false;
}

}  // namespace kcp::io
