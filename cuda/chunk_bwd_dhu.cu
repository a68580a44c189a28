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
// gla (ChunkParams::gla): w = 0, so w is neither fetched nor multiplied.
// Covered by tests/cuda/test_cuda_backward.cpp (stage "dhu" against the CPU twin, and end to end).
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_bwd_tiles.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/tile_mma.cuh"

namespace kcp::cuda {

namespace {

constexpr int kBV = 16;   // state columns per block
constexpr int kLdB = 24;  // [rows][16] tiles read as k-major B fragments (conflict-free: 8 or 24 mod 32)

template <int KD>
struct DhuSmem {
  static constexpr int ldk = KD + 4;  // kg [64][KD]: row-major A fragments (4 mod 32)
  static constexpr int ldw = KD + 8;  // w [64][KD]: transposed A fragments (8 mod 32)
  static constexpr int buf = kChunk * ldk + kChunk * ldw + kChunk * kLdB + KD * kLdB + KD;
  static constexpr int floats = KD * kLdB + kChunk * kLdB + 2 * buf;
  float *dh, *dvn, *b0;
  __device__ explicit DhuSmem(float* s) : dh(s), dvn(s + KD * kLdB), b0(s + KD * kLdB + kChunk * kLdB) {}
  // buffer b (0, 1): kg, w, A_c [64][16], B_c [KD][16], b_end [KD]
  __device__ float* kg(int b) const { return b0 + b * buf; }
  __device__ float* w(int b) const { return kg(b) + kChunk * ldk; }
  __device__ float* ac(int b) const { return w(b) + kChunk * ldw; }
  __device__ float* bc(int b) const { return ac(b) + kChunk * kLdB; }
  __device__ float* ge(int b) const { return bc(b) + KD * kLdB; }
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
    if (!p.gla) cp_async16(s.w(b) + r * S::ldw + i, p.w + o, r < L);  // gla: w = 0
  }
  if (local) {
    for (int idx = threadIdx.x; idx < kChunk * kBV / 4; idx += kBwdThreads) {
      const int r = idx / (kBV / 4), j = 4 * (idx % (kBV / 4)), rr = r < L ? r : 0;
      cp_async16(s.ac(b) + r * kLdB + j, bp.dvnew + (int64_t(ck.t0 + rr) * p.HV + hv) * bp.Vw + v0 + j, r < L);
    }
    for (int idx = threadIdx.x; idx < KD * kBV / 4; idx += kBwdThreads) {
      const int i = idx / (kBV / 4), j = 4 * (idx % (kBV / 4));
      cp_async16(s.bc(b) + i * kLdB + j, bp.dh + ((int64_t(c) * p.HV + hv) * KD + i) * bp.Vw + v0 + j, true);
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

// dvnew = A_c + kg dh on tensor cores (3xTF32: float32 accuracy): warp w owns rows 16 (w % 4),
// columns 8 (w / 4).
template <int KD>
__device__ void dhu_dvnew(const BwdParams& bp, const DhuSmem<KD>& s, int b, const ChunkInfo& ck, int hv, int v0, bool local) {
  using S = DhuSmem<KD>;
  const int w = threadIdx.x >> 5, m0 = 16 * (w & 3), n0 = 8 * (w >> 2);
  const float* kg = s.kg(b);
  float c[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = local ? s.ac(b)[acc_row(m0, e) * kLdB + acc_col(n0, e)] : 0.0f;
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 8) {
    const FragA<true> a = load_a<true>([&](int m, int k) { return kg[m * S::ldk + k]; }, m0, k0);
    const FragB<true> f = load_b<true>([&](int k, int n) { return s.dh[k * kLdB + n]; }, k0, n0);
    mma<true>(c, a, f);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = acc_row(m0, e), j = acc_col(n0, e);
    s.dvn[r * kLdB + j] = c[e];
    if (bp.dvnew && r < ck.len) bp.dvnew[(int64_t(ck.t0 + r) * bp.c.HV + hv) * bp.Vw + v0 + j] = c[e];
  }
}

// dh <- Diag(2^b_end) dh + B_c - w^T dvnew on tensor cores (3xTF32): warp w owns the 16-row
// tiles w, w + 8, .. of dh and both 8-column tiles.
template <int KD, bool kKDA>
__device__ void dhu_update(const DhuSmem<KD>& s, int b, int L, bool local) {
  using S = DhuSmem<KD>;
  constexpr int MT = KD / 16, MW = (MT + 7) / 8;
  const int w = threadIdx.x >> 5;
  const float* wt = s.w(b);
  float c[MW][2][4];
#pragma unroll
  for (int q = 0; q < MW; ++q) {
    const int m0 = 16 * min(w + 8 * q, MT - 1);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = acc_row(m0, e), j = acc_col(8 * nt, e);
        const float x = local ? s.bc(b)[i * kLdB + j] : 0.0f;
        c[q][nt][e] = fmaf(exp2f(s.ge(b)[kKDA ? i : 0]), s.dh[i * kLdB + j], x);
      }
    for (int k0 = 0; k0 < L; k0 += 8) {
      const FragA<true> a = load_a<true>([&](int m, int k) { return -wt[k * S::ldw + m]; }, m0, k0);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        mma<true>(c[q][nt], a, load_b<true>([&](int k, int n) { return s.dvn[k * kLdB + n]; }, k0, 8 * nt));
    }
  }
  __syncthreads();  // every read of dh is done
#pragma unroll
  for (int q = 0; q < MW; ++q) {
    if (w + 8 * q >= MT) continue;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s.dh[acc_row(16 * (w + 8 * q), e) * kLdB + acc_col(8 * nt, e)] = c[q][nt][e];
  }
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
    s.dh[i * kLdB + j] = x;
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
        bp.dh[((int64_t(c) * p.HV + hv) * KD + idx / kBV) * bp.Vw + v0 + idx % kBV] = s.dh[(idx / kBV) * kLdB + idx % kBV];
    dhu_dvnew<KD>(bp, s, b, ck, hv, v0, local);
    __syncthreads();
    dhu_update<KD, kKDA>(s, b, p.gla ? 0 : ck.len, local);  // gla: no w^T dvnew term (w = 0)
  }
  __syncthreads();
  if (bp.dh0.p)
    for (int idx = threadIdx.x; idx < KD * kBV; idx += kBwdThreads) {
      const int i = idx / kBV, j = idx % kBV;
      store_any(bp.dh0.p, bp.dh0.dt, n * bp.dh0.sn + hv * bp.dh0.shv + i * bp.dh0.si + (v0 + j) * bp.dh0.sj, s.dh[i * kLdB + j]);
    }
}

}  // namespace

void launch_bwd_dhu(const BwdParams& bp, cudaStream_t stream) {
  launch_bwd_dhu_local(bp, stream);
  launch_bwd_dhu_serial(bp, stream);
}

void launch_bwd_dhu_serial(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.N == 0) return;
  KCP_CHECK(bp.Vw % kBV == 0, "cuda-chunkwise backward: state columns ", bp.Vw, " must be a multiple of ", kBV);
  KCP_CHECK(!bp.d_o.p || (bp.dh && bp.dvnew && bp.Vw == p.V), "cuda-chunkwise backward: dhu with do needs the dh and dvnew buffers");
  dispatch_key_dim(p.K, [&](auto kd) {
    constexpr int KD = decltype(kd)::value;
    const size_t smem = sizeof(float) * DhuSmem<KD>::floats;
    const dim3 grid(p.N, p.HV, bp.Vw / kBV);
    if (p.kda) launch_kernel(bwd_dhu_kernel<KD, true>, grid, dim3(kBwdThreads), smem, stream, bp);
    else launch_kernel(bwd_dhu_kernel<KD, false>, grid, dim3(kBwdThreads), smem, stream, bp);
  });
}

}  // namespace kcp::cuda
