// Backward stage "chunk": every per-chunk gradient once dh and dvnew are known (CPU twins
// chunk_bwd_ht_products, chunk_inter_backward, chunk_wy_backward, chunk_intra_backward,
// chunk_gate_cumsum_backward). One block of 256 threads per (chunk c, value head hv); L rows;
// D_rs[d] = 2^(b_r[d] - b_s[d]) (s <= r, so <= 1), gamma_r = 2^b_r, e_r = 2^(b_end - b_r):
//   phase 1  dAqk = lower_incl(scale do vnew^T); G = strict_lower(gram(k, k) with D); Q = dvnew vnew^T
//   phase 2  dXu = P^T dvnew; dP = strict_lower(Q (I + Lmat)^T), Lmat = Diag(beta) G
//   phase 3  dq = gamma (scale do h^T); dXw = -dXu h^T; dk = e (vnew dh^T) + beta gamma dXw;
//            X1 = q dq_inter + beta k gamma dXw (dB_q + dB_wy), X2 = k dk_inter (dB_kg),
//            dB_all = gamma_end rowsum(h dh); T = P^T dP
//   phase 4  dv = beta dXu; dbeta = v.dXu + (k gamma).dXw; dL = -strict_lower(T P^T)
//   phase 5  intra: dq += sum_s dAqk_rs k_s D_rs; dk += sum_r dAqk_rs q_r D_rs + beta_s dL_sr k_r D_sr
//            + dL_rs beta_r k_r D_rs; dbeta += sum_s dL_rs G_rs
//   phase 6  da_t[d] = sum_{r>=t} X1_r + sum_{r<t} X2_r + dB_all + sum_{r>=t>s} M_rs k_s D_rs,
//            M_rs = dAqk_rs q_r + dL_rs beta_r k_r, by a running sum over t (no cancellation);
//            gdn sums the channels.
// q, k are the transformed qn, kn (float32); every product is a float32 FMA loop (no tensor cores).
// Covered by tests/cuda/test_cuda_backward.cpp.
#include "cuda/chunk_bwd.cuh"

#include "cuda/cuda_check.cuh"

namespace kcp::cuda {
namespace {

constexpr int kThreads = 256, kLL = kChunk * kChunk;

struct Ctx {
  const BwdParams* bp;
  int c, hv, h, L, K, V, Kg, HV;
  int64_t t0;
  float *dA, *G, *W1, *W2, *dXu, *dXw, *X1, *X2, *beta, *dbeta, *dBall;
  const float *P, *hS, *dhS;
  __device__ float g(int r, int d) const { return bp->c.gcum[((t0 + r) * HV + hv) * Kg + (Kg == 1 ? 0 : d)]; }
  __device__ float q(int r, int d) const { return bp->qn[((t0 + r) * bp->c.H + h) * K + d]; }
  __device__ float k(int r, int d) const { return bp->kn[((t0 + r) * bp->c.H + h) * K + d]; }
  __device__ float v(int r, int j) const { return load_any(bp->c.v.p, bp->c.v.dt, row_off(bp->c.v, t0 + r, hv) + j); }
  __device__ float dO(int r, int j) const { return load_any(bp->d_o.p, bp->d_o.dt, row_off(bp->d_o, t0 + r, hv) + j); }
  __device__ float vn(int r, int j) const { return bp->vnew[((t0 + r) * HV + hv) * V + j]; }
  __device__ float dvn(int r, int j) const { return bp->dvnew[((t0 + r) * HV + hv) * V + j]; }
  __device__ float Pm(int r, int s) const { return P[r * kChunk + s]; }  // r > s (unit diagonal implied)
  __device__ int64_t kv(int r, int d) const { return ((t0 + r) * HV + hv) * K + d; }
};

__device__ void phase1(const Ctx& x, float scale) {
  for (int idx = threadIdx.x; idx < x.L * x.L; idx += kThreads) {
    const int r = idx / x.L, s = idx % x.L;
    float a = 0.0f, gk = 0.0f, qv = 0.0f;
    for (int j = 0; j < x.V; ++j) {
      const float vs = x.vn(s, j);
      if (s <= r) a += x.dO(r, j) * vs;
      qv += x.dvn(r, j) * vs;
    }
    if (s < r)
      for (int d = 0; d < x.K; ++d) gk += x.k(r, d) * x.k(s, d) * exp2f(x.g(r, d) - x.g(s, d));
    x.dA[r * kChunk + s] = s <= r ? scale * a : 0.0f;
    x.G[r * kChunk + s] = gk;
    x.W1[r * kChunk + s] = qv;
  }
}

__device__ void phase2(const Ctx& x) {
  for (int idx = threadIdx.x; idx < x.L * x.V; idx += kThreads) {
    const int r = idx / x.V, j = idx % x.V;
    float a = x.dvn(r, j);
    for (int s = r + 1; s < x.L; ++s) a += x.Pm(s, r) * x.dvn(s, j);
    x.dXu[r * x.V + j] = a;
  }
  for (int idx = threadIdx.x; idx < x.L * x.L; idx += kThreads) {
    const int r = idx / x.L, s = idx % x.L;
    float a = 0.0f;
    if (s < r) {
      a = x.W1[r * kChunk + s];
      for (int t = 0; t < s; ++t) a += x.W1[r * kChunk + t] * x.beta[s] * x.G[s * kChunk + t];
    }
    x.W2[r * kChunk + s] = a;
  }
}

__device__ void phase3(const Ctx& x, float scale) {
  const BwdParams& bp = *x.bp;
  for (int idx = threadIdx.x; idx < x.L * x.K; idx += kThreads) {
    const int r = idx / x.K, i = idx % x.K;
    float doh = 0.0f, xw = 0.0f, vdh = 0.0f;
    for (int j = 0; j < x.V; ++j) {
      const float hv_ = x.hS[i * x.V + j];
      doh += x.dO(r, j) * hv_;
      xw -= x.dXu[r * x.V + j] * hv_;
      vdh += x.vn(r, j) * x.dhS[i * x.V + j];
    }
    const float gr = x.g(r, i), gam = exp2f(gr), e = exp2f(x.g(x.L - 1, i) - gr);
    const float dq = gam * scale * doh, dk = e * vdh, kr = x.k(r, i);
    x.dXw[r * x.K + i] = xw;
    bp.dqv[x.kv(r, i)] = dq;
    bp.dkv[x.kv(r, i)] = dk + x.beta[r] * gam * xw;
    x.X1[r * x.K + i] = x.q(r, i) * dq + x.beta[r] * kr * gam * xw;
    x.X2[r * x.K + i] = kr * dk;
  }
  for (int i = threadIdx.x; i < x.K; i += kThreads) {
    float a = 0.0f;
    for (int j = 0; j < x.V; ++j) a += x.hS[i * x.V + j] * x.dhS[i * x.V + j];
    x.dBall[i] = exp2f(x.g(x.L - 1, i)) * a;
  }
  for (int idx = threadIdx.x; idx < x.L * x.L; idx += kThreads) {  // T = P^T dP
    const int r = idx / x.L, s = idx % x.L;
    float a = 0.0f;
    for (int m = max(r, s + 1); m < x.L; ++m) a += (m == r ? 1.0f : x.Pm(m, r)) * x.W2[m * kChunk + s];
    x.W1[r * kChunk + s] = a;
  }
}

__device__ void phase4(const Ctx& x) {
  const BwdParams& bp = *x.bp;
  if (bp.dv.p)
    for (int idx = threadIdx.x; idx < x.L * x.V; idx += kThreads) {
      const int r = idx / x.V, j = idx % x.V;
      store_any(bp.dv.p, bp.dv.dt, row_off(bp.dv, x.t0 + r, x.hv) + j, x.beta[r] * x.dXu[r * x.V + j]);
    }
  for (int r = threadIdx.x; r < x.L; r += kThreads) {
    float a = 0.0f;
    for (int j = 0; j < x.V; ++j) a += x.v(r, j) * x.dXu[r * x.V + j];
    for (int i = 0; i < x.K; ++i) a += x.k(r, i) * exp2f(x.g(r, i)) * x.dXw[r * x.K + i];
    x.dbeta[r] = a;
  }
  for (int idx = threadIdx.x; idx < x.L * x.L; idx += kThreads) {  // dL = -strict_lower(T P^T)
    const int r = idx / x.L, s = idx % x.L;
    float a = 0.0f;
    if (s < r)
      for (int m = 0; m <= s; ++m) a -= x.W1[r * kChunk + m] * (m == s ? 1.0f : x.Pm(s, m));
    x.W2[r * kChunk + s] = a;
  }
}

__device__ void phase5(const Ctx& x) {
  const BwdParams& bp = *x.bp;
  const float* dL = x.W2;
  for (int idx = threadIdx.x; idx < x.L * x.K; idx += kThreads) {
    const int r = idx / x.K, d = idx % x.K;
    const float gr = x.g(r, d);
    float dq = 0.0f, dk = 0.0f, gx = 0.0f, gy = 0.0f;
    for (int s = 0; s <= r; ++s) {
      const float D = exp2f(gr - x.g(s, d)), ks = x.k(s, d);
      dq += x.dA[r * kChunk + s] * ks * D;
      if (s < r) gx += dL[r * kChunk + s] * ks * D;
    }
    for (int t = r; t < x.L; ++t) {
      const float D = exp2f(x.g(t, d) - gr);
      dk += x.dA[t * kChunk + r] * x.q(t, d) * D;
      if (t > r) gy += dL[t * kChunk + r] * x.beta[t] * x.k(t, d) * D;
    }
    bp.dqv[x.kv(r, d)] += dq;
    bp.dkv[x.kv(r, d)] += dk + x.beta[r] * gx + gy;
  }
  for (int r = threadIdx.x; r < x.L; r += kThreads) {
    float a = 0.0f;
    for (int s = 0; s < r; ++s) a += dL[r * kChunk + s] * x.G[r * kChunk + s];
    x.dbeta[r] += a;
  }
}

// Channel d: suffix sums of X1 in place, then the ascending pass with the intra running sums F
// (in dXw's space) and the result into X2.
__device__ void phase6(const Ctx& x) {
  const float* dL = x.W2;
  for (int d = threadIdx.x; d < x.K; d += kThreads) {
    float acc = 0.0f;
    for (int t = x.L - 1; t >= 0; --t) acc += x.X1[t * x.K + d], x.X1[t * x.K + d] = acc;
    for (int r = 0; r < x.L; ++r) x.dXw[r * x.K + d] = 0.0f;
    float pre = x.dBall[d];
    for (int t = 0; t < x.L; ++t) {
      const float gt = x.g(t, d);
      float intra = 0.0f;
      for (int r = t; r < x.L; ++r) intra += exp2f(x.g(r, d) - gt) * x.dXw[r * x.K + d];
      const float x2 = x.X2[t * x.K + d];
      x.X2[t * x.K + d] = x.X1[t * x.K + d] + pre + intra;
      pre += x2;
      if (t + 1 < x.L) {
        const float f = exp2f(x.g(t + 1, d) - gt), kt = x.k(t, d);
        for (int r = t + 1; r < x.L; ++r) {
          const float m = x.dA[r * kChunk + t] * x.q(r, d) + dL[r * kChunk + t] * x.beta[r] * x.k(r, d);
          x.dXw[r * x.K + d] = f * (x.dXw[r * x.K + d] + m * kt);
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) bwd_chunk_kernel(const __grid_constant__ BwdParams bp) {
  const ChunkParams& p = bp.c;
  const ChunkInfo ck = p.chunks[blockIdx.x];
  extern __shared__ float smem[];
  Ctx x;
  x.bp = &bp, x.c = blockIdx.x, x.hv = blockIdx.y, x.h = x.hv / p.G, x.L = ck.len, x.K = p.K, x.V = p.V;
  x.Kg = p.kda ? p.K : 1, x.HV = p.HV, x.t0 = ck.t0;
  x.dA = smem, x.G = x.dA + kLL, x.W1 = x.G + kLL, x.W2 = x.W1 + kLL, x.dXu = x.W2 + kLL;
  x.dXw = x.dXu + kChunk * p.V, x.X1 = x.dXw + kChunk * p.K, x.X2 = x.X1 + kChunk * p.K;
  x.beta = x.X2 + kChunk * p.K, x.dbeta = x.beta + kChunk, x.dBall = x.dbeta + kChunk;
  const int64_t blk = int64_t(x.c) * p.HV + x.hv;
  x.P = p.P + blk * kLL, x.hS = bp.h + blk * p.K * p.V, x.dhS = bp.dh + blk * p.K * p.V;
  for (int r = threadIdx.x; r < x.L; r += kThreads) x.beta[r] = p.beta_e[(x.t0 + r) * p.HV + x.hv];
  __syncthreads();
  phase1(x, p.scale);
  __syncthreads();
  phase2(x);
  __syncthreads();
  phase3(x, p.scale);
  __syncthreads();
  phase4(x);
  __syncthreads();
  phase5(x);
  __syncthreads();
  phase6(x);
  __syncthreads();
  for (int r = threadIdx.x; r < x.L; r += kThreads) bp.dbeta_e[(x.t0 + r) * p.HV + x.hv] = x.dbeta[r];
  for (int idx = threadIdx.x; idx < x.L * x.Kg; idx += kThreads) {
    const int r = idx / x.Kg, d = idx % x.Kg;
    float a = 0.0f;
    if (x.Kg == 1)
      for (int i = 0; i < x.K; ++i) a += x.X2[r * x.K + i];
    else a = x.X2[r * x.K + d];
    bp.da[((x.t0 + r) * p.HV + x.hv) * x.Kg + d] = a;
  }
}

}  // namespace

void launch_bwd_chunk(const BwdParams& bp, cudaStream_t stream) {
  const ChunkParams& p = bp.c;
  if (p.NT == 0) return;
  const size_t smem = sizeof(float) * (4 * kLL + kChunk * (p.V + 3 * p.K) + 2 * kChunk + p.K);
  launch_kernel(bwd_chunk_kernel, dim3(p.NT, p.HV), dim3(kThreads), smem, stream, bp);
}

}  // namespace kcp::cuda
