// Stores of accumulator tiles (tile_mma.cuh's C fragments) to row-major outputs of any dtype:
// acc_row_quads (four consecutive columns of one row per lane after one exchange with the neighbour
// lane), store4 / store2 (one store of four or two converted elements), store_acc_rows (a warp's
// tiles, grouped where the view is aligned for it, else element by element).
// Covered by tests/cuda/test_cuda_shapes.cpp ("o views at any element offset") and every stage test
// whose kernel stores through it (gla's output and dv, kda's chain o, the folded gdn kernel's o, hv's dv).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

// The four entries of one 8-column accumulator tile a thread holds (row r: a0 a1, row r + 8: b0 b1,
// columns 2t, 2t + 1, t = lane_t()) regrouped as four consecutive columns of one row: one exchange
// with the neighbour lane (every lane of the warp must call), then f(hh, c, x0, x1, x2, x3) stores
// row r + 8 hh, tile columns c .. c + 3 (even t: row r, c = 2t; odd t: row r + 8, c = 2t - 2). A warp
// then covers 16 rows x 4 columns per lane with one store per tile instead of two pairs or four
// elements: gla's output kernel -5%, kda's chain (o) -3% (H200, 2026-11-29). Inside a chain's step
// the exchange sits on the step's path: the state kernels' h / vnew and the folded kernel's o measured
// slower with it than with float2 pairs (docs/BENCHMARKS.md, seventeenth session).
template <class F>
__device__ __forceinline__ void acc_row_quads(float a0, float a1, float b0, float b1, F&& f) {
  const int t = lane_t();
  const bool odd = t & 1;
  const float s0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1), s1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
  if (odd) f(1, 2 * t - 2, s0, s1, b0, b1);
  else f(0, 2 * t, a0, a1, s0, s1);
}

// Four consecutive elements of type To at y, one store for 16- and 32-bit types (y aligned to four
// elements), converted as from_float converts.
template <class To>
__device__ __forceinline__ void store4(To* y, float x0, float x1, float x2, float x3) {
  if constexpr (std::is_same_v<To, float>) {
    *reinterpret_cast<float4*>(y) = make_float4(x0, x1, x2, x3);
  } else if constexpr (sizeof(To) == 2) {
    alignas(8) const To v[4] = {from_float<To>(x0), from_float<To>(x1), from_float<To>(x2), from_float<To>(x3)};
    *reinterpret_cast<uint2*>(y) = *reinterpret_cast<const uint2*>(v);
  } else {
    y[0] = from_float<To>(x0), y[1] = from_float<To>(x1), y[2] = from_float<To>(x2), y[3] = from_float<To>(x3);
  }
}
// Two consecutive elements of type To at y, one store for 16- and 32-bit types (y aligned to two).
template <class To>
__device__ __forceinline__ void store2(To* y, float x0, float x1) {
  if constexpr (std::is_same_v<To, float>) {
    *reinterpret_cast<float2*>(y) = make_float2(x0, x1);
  } else if constexpr (sizeof(To) == 2) {
    alignas(4) const To v[2] = {from_float<To>(x0), from_float<To>(x1)};
    *reinterpret_cast<uint32_t*>(y) = *reinterpret_cast<const uint32_t*>(v);
  } else {
    y[0] = from_float<To>(x0), y[1] = from_float<To>(x1);
  }
}

// A warp's accumulator tiles (rows mw .. mw + 15, NTW 8-column tiles) into rows < L of a row-major
// output of dtype code dt, element (r, c) at p + off + r * st + c, converted to the output's type
// (one dtype switch, outside the element loop). kGroup columns per store where the view allows it
// (row stride and start aligned to kGroup elements: a warp-uniform test), else one element each (an
// output view at any element offset is served, never a misaligned store): 4, after one exchange with
// the neighbour lane (acc_row_quads; every lane of the warp must call), or 2 (the thread's own pairs:
// inside a chain's step, where the exchange measured slower).
template <int kGroup = 4, int NTW>
__device__ __forceinline__ void store_acc_rows(void* p, int dt, int64_t off, int64_t st, int L, int mw,
                                               const float (&acc)[NTW][4]) {
  static_assert(kGroup == 2 || kGroup == 4, "store_acc_rows: groups of 2 or 4 columns");
  with_element_type(dt, [&](auto tag) {
    using To = typename decltype(tag)::type;
    To* y = static_cast<To*>(p) + off;
    const bool grouped = st % kGroup == 0 && reinterpret_cast<uintptr_t>(y) % (kGroup * sizeof(To)) == 0;
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt) {
      if (grouped && kGroup == 4) {
        acc_row_quads(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3], [&](int hh, int c, float x0, float x1, float x2, float x3) {
          const int r = mw + lane_g() + 8 * hh;
          if (r < L) store4(y + int64_t(r) * st + 8 * nt + c, x0, x1, x2, x3);
        });
      } else if (grouped) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = acc_row(mw, e);
          if (r < L) store2(y + int64_t(r) * st + acc_col(8 * nt, e), acc[nt][e], acc[nt][e + 1]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = acc_row(mw, e);
          if (r < L) y[int64_t(r) * st + acc_col(8 * nt, e)] = from_float<To>(acc[nt][e]);
        }
      }
    }
  });
}

}  // namespace kcp::cuda
