// What a dump means: the operator call it records, decoded from /inputs and the root attributes.
//   gdn/kda/gla: Problem (sizes from the tensors, flags and scale from the attributes) + Inputs +
//   Cotangents (do, dht), all views into tensors the call owns; conv1d: x [B,T,D], weight [D,W],
//   bias [D], dy, cu_seqlens, activation. Placement: the per-rank fields of schema version 2
//   (defaults: one rank). Every rejected input names the file and the dataset or attribute:
//   "x.h5: /inputs/k: expected shape [B,T,H,K] = [1,64,2,32], got [1,60,2,32]".
// Covered by tests/io/test_dump.cpp and tests/io/test_bad_input.cpp.
#pragma once

#include <map>
#include <string>

#include "core/problem.h"
#include "io/dump.h"

namespace kcp::io {

// Where a per-rank capture sits in a TP/CP run (docs/DUMP_FORMAT.md section 5, docs/ALGORITHMS.md section 5.1).
struct Placement {
  int64_t tp_size = 1, tp_rank = 0, cp_size = 1, cp_rank = 0;  // cp_rank -1: a reassembled file
  std::string cp_mode = "none";                                // none | headwise | chunkwise
  std::string cp_partition;                                    // zigzag | contiguous
  int64_t head_offset = 0, token_offset = 0;                   // global index of the first local head / token
  int64_t pre_num_ranks = 0, post_num_ranks = 0, pre_num_conv_tokens = 0;
  bool is_first_rank = true, is_last_rank = true;
  // A chunkwise shard's outputs depend on earlier ranks' states, its gradients also on later ranks.
  bool forward_self_contained() const { return cp_mode != "chunkwise" || is_first_rank; }
  bool backward_self_contained() const { return cp_mode != "chunkwise" || (is_first_rank && is_last_rank); }
  std::string describe() const;  // "single rank", "tp 0/2, cp 1/4 chunkwise, tokens from 2560"
};
Placement dump_placement(const Dump& d);

// Inputs of the call in the input's own dtype; move-only because the views point into `tensors`.
struct OpCall {
  OpCall() = default;
  OpCall(OpCall&&) = default;
  OpCall& operator=(OpCall&&) = default;
  OpCall(const OpCall&) = delete;
  OpCall& operator=(const OpCall&) = delete;

  std::string path;
  Problem problem;
  std::map<std::string, Array> tensors;  // owning copies of /inputs/*
  Inputs inputs;
  Cotangents cotangents;                 // d_o empty: the dump holds no backward pass
  DType input_dtype = DType::f32;        // root attribute input_dtype, else q's dtype
  Placement placement;
};
OpCall dump_op_call(const Dump& d, DType compute);

struct Conv1dCall {
  Conv1dCall() = default;
  Conv1dCall(Conv1dCall&&) = default;
  Conv1dCall& operator=(Conv1dCall&&) = default;
  Conv1dCall(const Conv1dCall&) = delete;
  Conv1dCall& operator=(const Conv1dCall&) = delete;

  std::string path;
  std::map<std::string, Array> tensors;
  TensorView x, weight, bias, dy;        // bias, dy optional
  std::vector<int64_t> cu_seqlens;
  bool silu = true;                      // activation swish/silu, else identity
  DType input_dtype = DType::f32;
  Placement placement;
};
Conv1dCall dump_conv1d_call(const Dump& d);

// The rank-local cu_seqlens of the contiguous CP shard [lo, hi) from the global one, as FLA derives
// it (ALGORITHMS.md 5.1): clamp(cu, lo, hi) - lo, consecutive duplicates removed.
std::vector<int64_t> local_cu_seqlens(const std::vector<int64_t>& cu, int64_t lo, int64_t hi);

// The names of the oracle's results for an op: o, final_state, dq, ... / y, dx, dweight, dbias.
bool result_name_known(std::string_view op, std::string_view name);

}  // namespace kcp::io
