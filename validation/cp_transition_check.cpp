// cp_transition_pairs: FLA's stored per-rank transitions against the oracle's (see cp_transition_check.h).
#include "validation/cp_transition_check.h"

#include <cmath>

#include "core/transition.h"
#include "io/dump_call.h"
#include "validation/cases.h"
#include "validation/tolerance.h"

namespace kcp::val {
namespace {

// One direction: which dataset, which local sequence FLA's kernel covers, and the names of its parts.
struct Direction {
  const char* dataset;
  bool backward;
  const char* s_name;  // "cp_transition_fwd.S" / "cp_transition_bwd.dS"
  const char* m_name;  // "cp_transition_fwd.M" / "cp_transition_bwd.MT"
};
constexpr Direction kFwd{kTransitionFwd, false, kTransitionRows[0], kTransitionRows[1]};
constexpr Direction kBwd{kTransitionBwd, true, kTransitionRows[2], kTransitionRows[3]};

const io::DumpDataset* stored_transition(const io::Dump& d, const char* name) {
  const io::DumpGroup* g = d.group(kTransitionGroup);
  return g ? g->find(name) : nullptr;
}

bool all_zero(const TensorView& v) {
  const Tensor<double> t = to_tensor<double>(v);
  for (double x : t.vec())
    if (x != 0) return false;
  return true;
}

// One row per part with the same skip / problem (nothing to compare).
void not_compared(const Direction& dir, DType stored, const std::string& skip, const std::string& problem,
                  std::vector<TransitionPair>& out) {
  for (const char* name : {dir.s_name, dir.m_name}) {
    TransitionPair p;
    p.tensor = name, p.stored = stored, p.skip = skip, p.problem = problem;
    out.push_back(std::move(p));
  }
}

// Why FLA computed nothing on this rank for `dir` (empty: it did), from the context fields it recorded.
std::string fla_skips(const Direction& dir, const io::Placement& pl) {
  if (!dir.backward && pl.is_last_rank)
    return "FLA computes no forward transition here: the rank's last sequence ends on this rank "
           "(cp_is_last_rank); it gathers zeros that no rank reads";
  if (dir.backward && pl.is_first_rank)
    return "FLA computes no backward transition here: the rank's first sequence starts on this rank "
           "(cp_is_first_rank); it gathers zeros that no rank reads";
  return "";
}

// The stored [HV,K,V+K] (or [1,HV,K,V+K]) element as a view, or an error message naming the shape.
std::string element_of(const io::DumpDataset& ds, const Problem& p, TensorView& e) {
  e = ds.data.view();
  if (e.rank() == 4 && e.dim(0) == 1) e = transition_element(e, 0);
  const Shape want = {p.HV, p.K, p.V + p.K};
  if (e.shape != want)
    return "/debug/" + ds.name + ": shape " + shape_str(ds.data.shape) + ", expected [HV,K,V+K] = " +
           shape_str(want) + " (FLA's hm / dhm of this rank)";
  if (!dtype_is_float(ds.data.dtype)) return "/debug/" + ds.name + ": stored as " +
                                             std::string(dtype_name(ds.data.dtype)) + ", not floats";
  return "";
}

void judge_direction(Backend& host, const io::Dump& d, const io::OpCall& call, const Direction& dir,
                     std::vector<TransitionPair>& out) {
  const io::DumpDataset* ds = stored_transition(d, dir.dataset);
  if (!ds) return;
  const Problem& p = call.problem;
  const io::Placement& pl = call.placement;
  if (pl.cp_mode != "chunkwise" || pl.cp_rank < 0)
    return not_compared(dir, ds->source, "", "/debug/" + std::string(dir.dataset) + " in a file that is not a " +
                        "chunkwise CP rank file (" + pl.describe() + "): nothing to judge it against", out);
  TensorView e;
  if (std::string bad = element_of(*ds, p, e); !bad.empty()) return not_compared(dir, ds->source, "", bad, out);
  const std::string fla_skip = fla_skips(dir, pl);
  if (!fla_skip.empty() && all_zero(e)) return not_compared(dir, ds->source, fla_skip, "", out);
  if (dir.backward && call.cotangents.d_o.empty())
    return not_compared(dir, ds->source, "no /inputs/do: the backward transition needs the rank's do", "", out);
  if (p.N < 1) return not_compared(dir, ds->source, "", "the rank holds no sequence", out);
  // FLA: the forward runs over cu_seqlens[-2:] (the last local sequence), the backward over cu_seqlens[:2].
  const int64_t seq = dir.backward ? 0 : p.N - 1;
  const SeqTransition oracle = sequence_transition(host, p, call.inputs, call.cotangents.d_o, seq, dir.backward);
  const Tensor<double> parts[2] = {to_tensor<double>(transition_s(e)), to_tensor<double>(transition_m(e))};
  const Tensor<double>* refs[2] = {&oracle.s, &oracle.m};
  for (int i = 0; i < 2; ++i) {
    TransitionPair tp;
    tp.tensor = i == 0 ? dir.s_name : dir.m_name;
    tp.candidate = parts[i], tp.oracle = *refs[i], tp.stored = ds->source;
    tp.bar = transition_bar(dir.backward && i == 0, ds->source, call.input_dtype);
    out.push_back(std::move(tp));
  }
}

}  // namespace

bool has_cp_transitions(const io::Dump& d) {
  return stored_transition(d, kTransitionFwd) || stored_transition(d, kTransitionBwd);
}

std::vector<TransitionPair> cp_transition_pairs(Backend& host, const io::Dump& d, DType compute) {
  KCP_CHECK(host.device() == Device::host, "cp_transition_pairs: needs a host backend, got ", host.name());
  std::vector<TransitionPair> out;
  if (!has_cp_transitions(d)) return out;
  const io::OpCall call = io::dump_op_call(d, compute);
  judge_direction(host, d, call, kFwd, out);
  judge_direction(host, d, call, kBwd, out);
  return out;
}

Bar transition_bar(bool state_gradient, DType stored, DType input) {
  if (stored == DType::f64 && input == DType::f64)
    return {tol::kExactF64, false, false, "float64 inputs and transition: two exact algorithms"};
  // FLA computes both in float32 from its bf16 intermediates (w, u, gated k/q) with float32 products of
  // the per-chunk maps: the same chain that gives ht (and, backward, dh0) in its chunk kernels, so its
  // test_chunk bars apply, with its absolute pass (a map that decayed to ~0 has a meaningless ratio).
  if (state_gradient)
    return {tol::kFlaChunkGrad, false, true,
            "FLA test_chunk's dh0 bar: dS_ext is dh0 of the rank's first sequence with dht = 0"};
  return {tol::kFlaChunkOutput, false, true,
          "FLA test_chunk's ht bar: S_ext / M are the final state / state map of a zero-state chain"};
}

}  // namespace kcp::val
