// plan_padding() and the view helpers of the shape adapter (see pad_plan.h).
#include "core/pad_plan.h"

#include <algorithm>
#include <sstream>

namespace kcp {
namespace {

std::string list_str(const std::vector<int64_t>& xs, const char* last_sep) {
  std::ostringstream os;
  for (size_t i = 0; i < xs.size(); ++i) os << (i == 0 ? "" : i + 1 == xs.size() ? last_sep : ", ") << xs[i];
  return os.str();
}

// Kp for K, or 0 when K is above every instantiated K.
int64_t padded_key_dim(int64_t K, const std::vector<int64_t>& dims) {
  if (dims.empty()) return K;
  for (int64_t d : dims)
    if (d >= K) return d;
  return 0;
}

}  // namespace

PadPlan plan_padding(const Problem& p, const PadRule& r) {
  PadPlan pl;
  pl.padded = p;
  pl.K = p.K, pl.V = p.V, pl.C = p.chunk_size;
  pl.Kp = padded_key_dim(p.K, r.key_dims);
  const int64_t m = std::max<int64_t>(r.value_multiple, 1);
  pl.Vp = (p.V + m - 1) / m * m;
  const bool chunk_ok = p.chunk_size == r.chunk_size ||
                        std::find(r.chunk_sizes.begin(), r.chunk_sizes.end(), p.chunk_size) != r.chunk_sizes.end();
  pl.Cp = chunk_ok ? r.chunk_size : p.chunk_size;
  if (pl.Kp == 0) {
    pl.Kp = p.K;
    pl.support = Support::no(detail::concat("K = ", p.K, ": ", r.owner, " is instantiated for K <= ", r.key_dims.back(),
                                            " (K = ", list_str(r.key_dims, " and "),
                                            "; a smaller K is zero-padded up to the next)"));
  } else if (!chunk_ok) {
    std::vector<int64_t> all = r.chunk_sizes;
    all.push_back(r.chunk_size);
    std::sort(all.begin(), all.end());
    pl.support = Support::no(detail::concat("chunk_size ", p.chunk_size, ": ", r.owner, " takes chunk_size ",
                                            list_str(all, " or "), " (computed with ", r.chunk_size, "-token chunks)"));
  }
  pl.padded.K = pl.Kp, pl.padded.V = pl.Vp, pl.padded.chunk_size = pl.Cp;  // scale stays the caller's
  return pl;
}

std::string PadPlan::describe() const {
  std::ostringstream os;
  if (pads()) {
    os << "pad";
    if (Kp != K) os << " K " << K << "->" << Kp;
    if (Vp != V) os << (Kp != K ? "," : "") << " V " << V << "->" << Vp;
  }
  if (Cp != C) os << (pads() ? "; " : "") << "chunk " << C << "->" << Cp;
  return os.str();
}

TensorView pad_heads(const TensorView& flat, int64_t HV, int64_t K) {
  if (flat.empty()) return {};
  KCP_CHECK(flat.rank() == 1 && flat.dim(0) == HV * K, "expected a per-channel view [HV*K] = [", HV * K, "], got ",
            shape_str(flat.shape));
  TensorView v = flat;
  v.shape = {HV, K}, v.stride = {K * flat.stride[0], flat.stride[0]};
  return v;
}

TensorView padded_transition_s(const TensorView& padded, int64_t K, int64_t V) {
  return padded.narrow(2, 0, K).narrow(3, 0, V);
}

TensorView padded_transition_m(const TensorView& padded, int64_t K, int64_t Vp) {
  return padded.narrow(2, 0, K).narrow(3, Vp, K);
}

}  // namespace kcp
