// The padding plan of the shape adapter (core/padded_backend.h): how a call whose K, V or chunk size a
// backend's kernels are not instantiated for is mapped, exactly, onto one they are.
//   K -> Kp: the smallest instantiated K >= K (16 -> 32, 48 -> 64, 96 -> 128); a K above the largest
//            is refused with a reason naming the limit.
//   V -> Vp: the next multiple of the value tile (16 -> 32, 40 -> 64, 72 -> 96).
//   C -> Cp: an accepted chunk size other than the kernels' one is computed with the kernels' one
//            (the chunkwise result is the same function of the inputs for every chunk size; only the
//            float rounding differs).
// The padded problem keeps everything else, in particular scale (K^-0.5 of the caller's K, never Kp's).
// Each tensor's padded shape is its shape function (core/problem.h) of the padded problem; the caller's
// values sit in the leading corner of every padded axis. A per-channel dt_bias [HV*K] is padded as
// [HV, K] -> [HV, Kp] (pad_heads below).
// Covered by tests/core/test_padded.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"

namespace kcp {

struct PadRule {
  std::string owner;                 // the backend whose limits these are, for reasons ("cuda-chunkwise")
  std::vector<int64_t> key_dims;     // the K the kernels run, ascending; empty: K is never padded
  int64_t value_multiple = 1;        // V is padded up to a multiple of this
  int64_t chunk_size = 64;           // the chunk size the kernels compute with
  std::vector<int64_t> chunk_sizes;  // further chunk sizes accepted (computed with chunk_size)
};

struct PadPlan {
  Support support;  // !ok: the call cannot be served (the reason names the limit)
  Problem padded;   // what the inner backend is given
  int64_t K = 0, Kp = 0, V = 0, Vp = 0, C = 0, Cp = 0;
  bool pads() const { return Kp != K || Vp != V; }
  bool changes() const { return pads() || Cp != C; }
  std::string describe() const;  // "pad K 16->32, V 40->64; chunk 32->64" or "" when nothing changes
};

PadPlan plan_padding(const Problem& p, const PadRule& rule);

// A per-channel [HV*K] view (dt_bias, ddt_bias) seen as [HV, K] (strides, no copy).
TensorView pad_heads(const TensorView& flat, int64_t HV, int64_t K);

// The values of a padded packed transition [count,HV,Kp,Vp+Kp] that belong to the caller's
// [count,HV,K,V+K]: its S part and its M part (strided views of `padded`).
TensorView padded_transition_s(const TensorView& padded, int64_t K, int64_t V);
TensorView padded_transition_m(const TensorView& padded, int64_t K, int64_t Vp);

}  // namespace kcp
