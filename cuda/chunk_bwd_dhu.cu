// Backward stage "dhu" (FLA chunk_gated_delta_rule_bwd_dhu; CPU twin chunk_bwd_dAv +
// chunk_state_backward), part 2 of 2: the serial recurrence. One block of 256 threads per
// (sequence n, value head hv, 32 state columns [v0, v0+32)), walking the chunks of n last to first
// with dh [K,32] in shared memory; the chunk-local terms come from part 1 (chunk_bwd_dhu_local.cu):
//   dh[c]  = dh                                        (kept for the chunk stage)
//   dvnew  = A_c + kg dh                  [L,32]       A_c = Aqk^T do,  kg_r = kn_r 2^(b_end - b_r)
//   dh    <- Diag(2^b_end) dh + B_c - w^T dvnew,       B_c = scale qg^T do,  qg_r = qn_r 2^(b_r)
// (b: the chunk-local gate cumsum in log2 units, per channel for kda; every exponent <= 0.)
// dh starts from d_final_state (or 0), or from the identity for the CP transition's M^T (do = 0,
// Vw = K, no A_c, B_c); after chunk 0 it is written to dh0. The next chunk's kg, w, A_c, B_c
// arrive by cp.async while the current one is computed; register tiles, float32 FMA.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

void launch_bwd_dhu_local(const BwdParams& bp, cudaStream_t stream);

namespace {

constexpr int kBV = 32;

template <int KD>
struct DhuSmem {
  static constexpr int ldk = KD + 4;  // kg, w tiles [64][KD]
  static constexpr int buf = 2 * kChunk * ldk + kChunk * kBV + KD * kBV + KD;
  static constexpr int floats = KD * kBV + kChunk * kBV + 2 * buf;
  float *dh, *dvn, *b0;
  __device__ explicit DhuSmem(float* s) : dh(s), dvn(s + KD * kBV), b0(s + KD * kBV + kChunk * kBV) {}
  // buffer b (0, 1): kg, w [64][ldk], A_c [64][32], B_c [KD][32], b_end [KD]
  __device__ float* kg(int b) const { return b0 + b * buf; }
  __device__ float* w(int b) const { return kg(b) + kChunk * ldk; }
  __device__ float* ac(int b) const { return kg(b) + 2 * kChunk * ldk; }
  __device__ float* bc(int b) const { return ac(b) + kChunk * kBV; }
  __device__ float* ge(int b) const { return bc(b) + KD * kBV; }
};

// cp.async of chunk c's tiles into buffer b: kg, w (rows >= L zero), A_c, B_c (with do), b_end.
template <int KD, bool kKDA>
__device__ void dhu_fetch(const BwdParams& bp, const DhuSmem<KD>& s, int b, int c, int hv, int v0, bool local) {
  using S = DhuSmem<KD>;
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[c];
  const int L = ck.len;
  for (int idx = threadIdx.x; idx < kChunk * KD / 4; idx += kBwdThreads) {
    const int r = idx / (KD / 4), i = 4 * (idx % (KD / 4)), rr = r < L ? r : 0;
    const int64_t o = (int64_t(ck.t0 + rr) * p.HV + hv) * KD + i;
    cp_async16(s.kg(b) + r * S::ldk + i, bp.dkv + o, r < L);
    cp_async16(s.w(b) + r * S::ldk + i, p.w + o, r < L);
  }
  if (local) {
    for (int idx = threadIdx.x; idx < kChunk * kBV / 4; idx += kBwdThreads) {
      const int r = idx / (kBV / 4), j = 4 * (idx % (kBV / 4)), rr = r < L ? r : 0;
      cp_async16(s.ac(b) + r * kBV + j, bp.dvnew + (int64_t(ck.t0 + rr) * p.HV + hv) * bp.Vw + v0 + j, r < L);
    }
    for (int idx = threadIdx.x; idx < KD * kBV / 4; idx += kBwdThreads) {
      const int i = idx / (kBV / 4), j = 4 * (idx % (kBV / 4));
      cp_async16(s.bc(b) + i * kBV + j, bp.dh + ((int64_t(c) * p.HV + hv) * KD + i) * bp.Vw + v0 + j, true);
    }
  }
  const float* ge = p.gcum + (int64_t(ck.t0 + L - 1) * p.HV + hv) * (kKDA ? KD : 1);
  if constexpr (kKDA) {
    for (int idx = threadIdx.x; idx < KD / 4; idx += kBwdThreads) cp_async16(s.ge(b) + 4 * idx, ge + 4 * idx, true);
  } else if (threadIdx.x == 0) {
    cp_async4(s.ge(b), ge, true);
  }
  cp_async_commit();
}

// dvnew = A_c + kg dh: rows ty + 16 u, columns 2 tx, 2 tx + 1.
template <int KD>
__device__ void dhu_dvnew(const BwdParams& bp, const DhuSmem<KD>& s, int b, const ChunkInfo& ck, int hv, int v0, bool local) {
  using S = DhuSmem<KD>;
  const int ty = bwd_ty(), c2 = 2 * bwd_tx();
  float2 acc[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) acc[u] = local ? lds2(s.ac(b) + (ty + 16 * u) * kBV + c2) : make_float2(0.0f, 0.0f);
#pragma unroll 2
  for (int i = 0; i < KD; i += 4) {
    float2 d[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] = lds2(s.dh + (i + e) * kBV + c2);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float4 a = lds4(s.kg(b) + (ty + 16 * u) * S::ldk + i);
      acc[u].x = fmaf(a.w, d[3].x, fmaf(a.z, d[2].x, fmaf(a.y, d[1].x, fmaf(a.x, d[0].x, acc[u].x))));
      acc[u].y = fmaf(a.w, d[3].y, fmaf(a.z, d[2].y, fmaf(a.y, d[1].y, fmaf(a.x, d[0].y, acc[u].y))));
    }
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = ty + 16 * u;
    *reinterpret_cast<float2*>(s.dvn + r * kBV + c2) = acc[u];
    if (bp.dvnew && r < ck.len)
      *reinterpret_cast<float2*>(bp.dvnew + (int64_t(ck.t0 + r) * bp.c.HV + hv) * bp.Vw + v0 + c2) = acc[u];
  }
}

// dh <- Diag(2^b_end) dh + B_c - w^T dvnew: rows 4 a + 64 g + e (a = tid / 16), columns 2 tx, 2 tx + 1.
template <int KD, bool kKDA>
__device__ void dhu_update(const DhuSmem<KD>& s, int b, int L, bool local) {
  using S = DhuSmem<KD>;
  constexpr int NG = KD >= 64 ? KD / 64 : 1;
  const int a4 = 4 * bwd_ty(), c2 = 2 * bwd_tx();
  float2 acc[NG][4];
#pragma unroll
  for (int g = 0; g < NG; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = min(a4 + 64 * g + e, KD - 1);
      const float gam = exp2f(s.ge(b)[kKDA ? i : 0]);
      const float2 d = lds2(s.dh + i * kBV + c2), x = local ? lds2(s.bc(b) + i * kBV + c2) : make_float2(0.0f, 0.0f);
      acc[g][e] = make_float2(fmaf(gam, d.x, x.x), fmaf(gam, d.y, x.y));
    }
  for (int r = 0; r < L; ++r) {
    const float2 v = lds2(s.dvn + r * kBV + c2);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const float4 w = lds4(s.w(b) + r * S::ldk + min(a4 + 64 * g, KD - 4));
      const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[g][e].x = fmaf(-wv[e], v.x, acc[g][e].x), acc[g][e].y = fmaf(-wv[e], v.y, acc[g][e].y);
    }
  }
  __syncthreads();  // every read of dh is done
#pragma unroll
  for (int g = 0; g < NG; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (a4 + 64 * g < KD) *reinterpret_cast<float2*>(s.dh + (a4 + 64 * g + e) * kBV + c2) = acc[g][e];
}

template <int KD, bool kKDA>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_dhu_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkParams& p = bp.c;
  const int n = blockIdx.x, hv = blockIdx.y, v0 = blockIdx.z * kBV;
  extern __shared__ __align__(16) float smem[];
  const DhuSmem<KD> s(smem);
  const bool local = bp.d_o.p != nullptr;
  for (int idx = threadIdx.x; idx < KD * kBV; idx += kBwdThreads) {
    const int i = idx / kBV, j = idx % kBV;
    float x = 0.0f;
    if (bp.init == kInitIdentity) x = i == v0 + j ? 1.0f : 0.0f;
    else if (bp.dht.p) x = load_any(bp.dht.p, bp.dht.dt, n * bp.dht.sn + hv * bp.dht.shv + i * bp.dht.si + (v0 + j) * bp.dht.sj);
    s.dh[idx] = x;
  }
  const int c_hi = p.seq_chunk0[n + 1] - 1, c_lo = p.seq_chunk0[n];
  if (c_hi >= c_lo) dhu_fetch<KD, kKDA>(bp, s, 0, c_hi, hv, v0, local);
  for (int c = c_hi, b = 0; c >= c_lo; --c, b ^= 1) {
    cp_async_wait<0>();
    __syncthreads();  // buffer b has arrived; buffer b ^ 1 and dvn are free
    if (c > c_lo) dhu_fetch<KD, kKDA>(bp, s, b ^ 1, c - 1, hv, v0, local);
    const ChunkInfo ck = p.chunks[c];
    if (bp.dh)
      for (int idx = threadIdx.x; idx < KD * kBV; idx += kBwdThreads)
        bp.dh[((int64_t(c) * p.HV + hv) * KD + idx / kBV) * bp.Vw + v0 + idx % kBV] = s.dh[idx];
    dhu_dvnew<KD>(bp, s, b, ck, hv, v0, local);
    __syncthreads();
    dhu_update<KD, kKDA>(s, b, ck.len, local);
  }
  __syncthreads();
  if (bp.dh0.p)
    for (int idx = threadIdx.x; idx < KD * kBV; idx += kBwdThreads) {
      const int i = idx / kBV, j = idx % kBV;
      store_any(bp.dh0.p, bp.dh0.dt, n * bp.dh0.sn + hv * bp.dh0.shv + i * bp.dh0.si + (v0 + j) * bp.dh0.sj, s.dh[idx]);
    }
}

}  // namespace

void launch_bwd_dhu(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.N == 0) return;
  KCP_CHECK(bp.Vw % kBV == 0, "cuda-chunkwise backward: state columns ", bp.Vw, " must be a multiple of ", kBV);
  KCP_CHECK(!bp.d_o.p || (bp.dh && bp.dvnew && bp.Vw == p.V), "cuda-chunkwise backward: dhu with do needs the dh and dvnew buffers");
  launch_bwd_dhu_local(bp, stream);
  dispatch_key_dim(p.K, [&](auto kd) {
    constexpr int KD = decltype(kd)::value;
    const size_t smem = sizeof(float) * DhuSmem<KD>::floats;
    const dim3 grid(p.N, p.HV, bp.Vw / kBV);
    if (p.kda) launch_kernel(bwd_dhu_kernel<KD, true>, grid, dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_dhu_kernel<KD, false>, grid, dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
