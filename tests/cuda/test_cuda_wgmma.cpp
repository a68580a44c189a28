// The warpgroup-MMA operand layouts of cuda/wgmma.cuh (the ones the folded state kernel uses), each
// as one exact product: small integers are exact in bfloat16 and TF32 and their sums in float32,
// so any misplaced element shows as a mismatch. Skipped where no CUDA device is present.
#include <doctest/doctest.h>

#include <string>

#include "cuda/wgmma_probe.h"
#include "tests/cuda/cuda_support.h"

using namespace kcp;

TEST_CASE("wgmma operand layouts give exact products" * doctest::skip(!test::gpu_present())) {
  using L = cuda::WgmmaLayout;
  const std::pair<L, const char*> layouts[] = {
      {L::kKMajorA16, "16-bit A K-major"},          {L::kMMajorA16, "16-bit A M-major"},
      {L::kTf32, "TF32 K-major"},                   {L::kKMajorA16Sw, "16-bit A K-major swizzled"},
      {L::kMMajorA16Sw, "16-bit A M-major swizzled"}, {L::kTf32Sw, "TF32 K-major swizzled"}};
  for (const auto& [layout, name] : layouts)
    for (int N : {16, 32}) {
      SUBCASE((std::string(name) + " N=" + std::to_string(N)).c_str()) {
        const int K = cuda::wgmma_probe_k(layout);
        std::vector<float> a(size_t(64 * K)), b(size_t(K * N));
        for (int i = 0; i < 64 * K; ++i) a[size_t(i)] = float((i * 7 + i / K) % 5 - 2);
        for (int i = 0; i < K * N; ++i) b[size_t(i)] = float((i * 3 + i / N) % 7 - 3);
        const std::vector<float> d = cuda::wgmma_probe(layout, a, b, N);
        int wrong = 0;
        for (int m = 0; m < 64; ++m)
          for (int n = 0; n < N; ++n) {
            float ref = 0;
            for (int k = 0; k < K; ++k) ref += a[size_t(m * K + k)] * b[size_t(k * N + n)];
            if (d[size_t(m * N + n)] != ref && ++wrong <= 3)
              MESSAGE("D(", m, ",", n, ") = ", d[size_t(m * N + n)], ", expected ", ref);
          }
        CHECK(wrong == 0);
      }
    }
}
