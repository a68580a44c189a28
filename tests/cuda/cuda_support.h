// Helpers of the CUDA suites: device presence, staging a seeded case on the backend's device in a
// chosen input dtype (with the host copy rounded the same way, so the oracle sees the device's
// values), NaN-poisoned device outputs (all bits set: NaN in float32, float16 and bfloat16), and
// downloads to float64 host tensors for compare().
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "validation/cases.h"

namespace kcp::test {

bool gpu_present();
inline constexpr const char* kNoGpuMessage = "no CUDA device: skipped";

// q, k, v rounded to `qkv`, the gates g to `gates` and every other input to float32, in place.
val::CaseData round_case(val::CaseData c, DType qkv, DType gates = DType::f32);
// The transition tests' case: packed lengths {70, 0, 130, 1} (an empty and a one-token sequence),
// H = 1, HV = 2, K = 64, V = 32; kda with the in-kernel L2 norm, gdn with the beta sigmoid.
val::CaseSpec transition_case_spec(Variant var, DType qkv, uint64_t seed);
// The sequence ranges [first, first + count) the transition tests ask for on that layout: all four, a
// middle pair (from the empty sequence), the last (one token).
struct SeqRange {
  int64_t first, count;
};
inline constexpr SeqRange kTransitionRanges[] = {{0, 4}, {1, 2}, {3, 1}};
// The 64-token chunks of p's sequences (the last of each shorter): the CUDA pipeline's chunk table, so
// what Pipeline::kda_windows_used() counts windows of.
int64_t cuda_chunk_count(const Problem& p);

// Holds the backend's stream (a host function that waits) until release() or the destructor, or 20 s:
// work queued behind it stays in flight, for the tests of what concurrent pipelines see. Nothing that
// waits for the stream on the host may run before release (the 20 s are the bound if one does).
class StreamGate {
 public:
  explicit StreamGate(Backend& be);
  ~StreamGate() { release(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void release() { open_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

using kcp::DeviceTensor;
DeviceTensor device_tensor(Backend& be, DType dt, const Shape& shape);              // uninitialized
DeviceTensor poisoned(Backend& be, DType dt, const Shape& shape);                   // every element NaN
DeviceTensor to_device(Backend& be, const Tensor<double>& t, DType dt);             // converted copy
void upload_into(Backend& be, const TensorView& dst, const Tensor<double>& src);    // same numel
void poison(Backend& be, const TensorView& dst);
Tensor<double> to_host(Backend& be, const TensorView& v);
// Elements of a float32 device tensor that are not TF32 values (nonzero low 13 mantissa bits): 0 where
// a kernel stored the tensor rounded for its readers (gla's plain-forward h, chunk_state_gla.cu stored_h).
int64_t count_not_tf32(Backend& be, const TensorView& v);

// A seeded case with the dtype its q, k, v (and d_o) are staged in; name() for subcases and messages.
struct DtypeCase {
  val::CaseSpec spec;
  DType qkv = DType::bf16;
  std::string name() const { return spec.name() + " qkv=" + std::string(dtype_name(qkv)); }
};
// The same with the dtype o is written in (the forward sweep, the gla halves test).
struct DtypeOCase {
  val::CaseSpec spec;
  DType qkv = DType::bf16, o = DType::f32;
  std::string name() const {
    return spec.name() + " qkv=" + std::string(dtype_name(qkv)) + " o=" + std::string(dtype_name(o));
  }
};

// One result against its reference: prints rel_l2 and max_abs, checks (doctest) that every element
// was written (outputs were NaN-poisoned), that nothing is NaN/Inf beyond the reference's, and
// rel_l2 <= bar; returns whether all held (so a staged test can stop at its first failing stage).
bool check_rel_l2(const std::string& what, const std::string& name, const Tensor<double>& got, const TensorView& ref,
                  double bar);

struct DeviceInputs {
  std::vector<DeviceTensor> tensors;
  Inputs views;
};
// q, k, v in `qkv`, g in `gates` (round_case's), the rest float32.
DeviceInputs upload_inputs(Backend& be, const val::CaseData& c, DType qkv, DType gates = DType::f32);

// Device gradients shaped like a host set (the oracle's): dq, dk, dv in the input dtype, the rest
// float32 (FLA's dtypes), NaN-poisoned; one entry per gradient the host set holds, with its name
// (val::named_tensors' names) and the host tensor it is judged against.
struct DeviceGrad {
  std::string name;
  DeviceTensor t;
  const Tensor<double>* want;
};
struct DeviceGrads {
  std::vector<DeviceGrad> t;
  Grads views;
};
DeviceGrads device_grads(Backend& be, const val::GradSet<double>& host, DType qkv);
// The bar of a gradient from 16-bit inputs (tolerance.h): kFlaChunkGateBeta for dg, dbeta, dA_log and
// ddt_bias, kFlaChunkGrad for the others.
double fla_chunk_bar(const std::string& grad);

}  // namespace kcp::test
