// Judging a layer dump (layer_dump.h) against the float64 layer oracle: run reference/layer.h on the
// dump's x, weights and config, then pair every tensor the producer stored with the oracle's, in
// pipeline order (in_proj, gate projections, conv, qk norm, beta, kernel, output norm, output gate,
// out_proj), then the backward in its own order (layer_backward_names: dy, do, ..., dq, ..., dx and
// each weight gradient, labelled by the stage whose backward produced it). The first pair over its
// bar names the stage where the producer first departs; later stages inherit the error, so only the
// first one is the diagnosis.
// Bars (tolerance.h kLayer*) follow the dtype the tensor was produced in.
// Covered by tests/validation/test_layer_dump.cpp (planted errors, one per stage).
#pragma once

#include <string>
#include <vector>

#include "validation/layer_dump.h"
#include "validation/policy.h"

namespace kcp::val {

struct LayerPair {
  std::string tensor;        // "qkv_conv", "dx", "grads/conv1d.weight", ...
  std::string stage;         // "conv", "kernel", "backward", ...
  Tensor<double> candidate;  // the dump's
  Tensor<double> oracle;     // empty when the shapes disagree (see problem)
  DType stored = DType::f64;
  Bar bar;
  std::string problem;       // non-empty: cannot be compared (shape), counts as a failure
};

struct LayerCheck {
  std::string description;   // the config and sizes
  std::vector<LayerPair> pairs;
};
LayerCheck layer_check(const LayerDumpCall& c);
// "kda-layer(hidden=..,...) x [B,T,hidden] packed N=3": the config and sizes of a call.
std::string layer_check_description(const LayerDumpCall& c);
// The backward tensors in the order the backward produces them, each with its stage ("kernel bwd", ...).
const std::vector<LayerStageName>& layer_backward_names();
Bar layer_bar(DType stored);

// Index of the first pair that fails (problem, or judge() == fail); -1 when none does.
int layer_first_departure(const LayerCheck& lc);

}  // namespace kcp::val
