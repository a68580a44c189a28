// Device helpers shared by the chunk kernels: element conversion of the input types (float, half,
// bfloat16), loads/stores of small tensors whose dtype is only known at run time (gates, beta,
// states, o), and the fused gate activations of ALGORITHMS.md 2.2 in float32:
//   softplus gate:    a = -exp(A_log) * softplus(g + dt_bias)      (softplus(x) = x for x > 20)
//   lower-bound gate: a = lb * sigmoid(c * (g + dt_bias)),  c = exp(A_log) or 1
// RCP_LN2 = float32(log2 e): the chunk cumsum is kept in log2 units (b = RCP_LN2 * B) and every
// decay factor is exp2 of a difference that is <= 0 (ALGORITHMS.md 4.2-4.3).
// Covered through every stage by tests/cuda/test_cuda_stages.cpp and test_cuda_forward.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kcp::cuda {

// Run-time dtype codes of views passed to kernels (DType order does not matter on the device).
enum DCode : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };
// A 16-bit code (bf16 or fp16): its values are exact in TF32 and in float32.
__host__ __device__ constexpr bool is_16bit(int dt) { return dt == kBF16 || dt == kF16; }

constexpr float kRcpLn2 = 1.4426950216f;  // float32(log2 e), FLA's RCP_LN2

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(double x) { return float(x); }

template <class T> __device__ __forceinline__ T from_float(float x) { return T(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T> struct TypeTag { using type = T; };

// Calls f(TypeTag<T>{}) with the element type of dtype code dt (float for any other code, as
// store_any does), so an output loop converts with from_float<T> and no switch per element.
template <class F>
__device__ __forceinline__ void with_element_type(int dt, F&& f) {
  switch (dt) {
    case kBF16: f(TypeTag<__nv_bfloat16>{}); break;
    case kF16: f(TypeTag<__half>{}); break;
    case kF64: f(TypeTag<double>{}); break;
    default: f(TypeTag<float>{}); break;
  }
}

// 2^x of a gate difference in a kernel run on 16-bit inputs: one MUFU.EX2 (ex2.approx.ftz: relative
// error about 2^-22; a subnormal result, below 2^-126, becomes 0) instead of exp2f's range check and
// rescaling multiplies (four instructions). Used where the result is rounded to TF32 before any use
// (the gated kkt fragments, kg / qg), far below that rounding, and for the gate factors of the
// backward's float32 FMA paths (kernels intra and hv's epilogue), whose 16-bit-input results are
// judged at kCudaTf32 (1e-3; validation/tolerance.h). Triton's exp2, which FLA's kernels use for every
// gate factor, is the same instruction. S (split products, float32 inputs): exp2f (float32-accurate).
template <bool S>
__device__ __forceinline__ float exp2_approx(float x) {
  if constexpr (S) {
    return exp2f(x);
  } else {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }
}

__device__ __forceinline__ float load_any(const void* p, int dt, int64_t i) {
  switch (dt) {
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF64: return float(static_cast<const double*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// The same element as raw bits, converted later by bits_to_float: the conversion inside load_any's
// switch is the load's first use, so a loop of load_any waits out one memory round trip per element;
// a loop of load_bits issues all its loads first (16-bit codes in the low half; float64 is converted
// here, the one form whose bits do not fit).
__device__ __forceinline__ uint32_t load_bits(const void* p, int dt, int64_t i) {
  switch (dt) {
    case kF16:
    case kBF16: return static_cast<const uint16_t*>(p)[i];
    case kF64: return __float_as_uint(float(static_cast<const double*>(p)[i]));
    default: return static_cast<const uint32_t*>(p)[i];
  }
}
__device__ __forceinline__ float bits_to_float(uint32_t b, int dt) {
  switch (dt) {
    case kF16: return __half2float(__ushort_as_half(uint16_t(b)));
    case kBF16: return __uint_as_float(b << 16);
    default: return __uint_as_float(b);
  }
}

// Narrowing stores round to nearest even, like torch's .to(dtype).
__device__ __forceinline__ void store_any(void* p, int dt, int64_t i, float x) {
  switch (dt) {
    case kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case kF64: static_cast<double*>(p)[i] = double(x); break;
    default: static_cast<float*>(p)[i] = x; break;
  }
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Gate formula codes, in GateFormula's order.
enum GateCode : int { kGateLogDecay = 0, kGateSoftplus = 1, kGateLowerBound = 2 };

// a = gate(x) where x = g + dt_bias; `rate` = exp(A_log) (1 when A_log is absent).
__device__ __forceinline__ float gate_activate(int formula, float x, float rate, float lower_bound) {
  switch (formula) {
    case kGateSoftplus: return -rate * softplus_f(x);
    case kGateLowerBound: return lower_bound * sigmoid_f(rate * x);
    default: return x;
  }
}

}  // namespace kcp::cuda
