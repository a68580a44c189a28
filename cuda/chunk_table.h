// The chunk table, which tokens each chunk of a call covers (chunks_of; uploaded by
// cuda/chunkwise_impl.cuh build_table, read by the chunk kernels through chunk_params.cuh chunk_at),
// and its closed form where the layout has one: every sequence of the call has len tokens (nt
// chunks) and sequence s starts at token t0 + s len (B sequences of T tokens, or packed sequences of
// one length). Then chunk ci is (sequence s = ci / nt, index c = ci % nt), first token
// t0 + s len + 64 c, length min(64, len - 64 c), which a kernel computes instead of loading.
// Host and device; no CUDA types, so host code and the no-GPU tests include it. Covered by
// tests/cuda/test_cuda_backend.cpp (closed_form on layouts, no GPU) and
// tests/cuda/test_cuda_chunk_grid.cpp (the kernels with and without it, bit for bit).
#pragma once

#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define KCP_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define KCP_HOST_DEVICE_INLINE inline
#endif

namespace kcp::cuda {

constexpr int kChunk = 64;  // C: the only chunk size the kernels instantiate

struct ChunkInfo {
  int seq;  // sequence n (from the call's first)
  int t0;   // first flattened token
  int len;  // valid rows L (1..64)
  int index_in_seq;
};

// The closed form; len = 0: none (the kernels read the table).
struct ChunkGrid {
  int len = 0, nt = 0, t0 = 0;
};

KCP_HOST_DEVICE_INLINE ChunkInfo grid_entry(const ChunkGrid& g, int ci) {
  const int s = ci / g.nt, c = ci - s * g.nt, t0 = kChunk * c;
  return {s, g.t0 + s * g.len + t0, g.len - t0 < kChunk ? g.len - t0 : kChunk, c};
}

// The table of sequences given by their first flattened token and length, in order (sequence
// numbers from 0), and seq0: each sequence's first chunk, then the chunk count.
inline std::vector<ChunkInfo> chunks_of(const std::vector<int64_t>& starts, const std::vector<int64_t>& lens,
                                        std::vector<int>& seq0) {
  std::vector<ChunkInfo> chunks;
  seq0.clear();
  for (size_t n = 0; n < starts.size(); ++n) {
    seq0.push_back(int(chunks.size()));
    for (int64_t c = 0; c * kChunk < lens[n]; ++c) {
      const int64_t rows = lens[n] - c * kChunk;
      chunks.push_back({int(n), int(starts[n] + c * kChunk), int(rows < kChunk ? rows : kChunk), int(c)});
    }
  }
  seq0.push_back(int(chunks.size()));
  return chunks;
}

// The closed form of a table (sequence 0's length and chunk count, its first token), accepted only
// if grid_entry reproduces every entry; else len 0 (no chunks, an empty first sequence, lengths
// that differ, or sequences not back to back).
inline ChunkGrid closed_form(const std::vector<ChunkInfo>& chunks) {
  int len = 0, nt = 0;
  for (const ChunkInfo& c : chunks) {
    if (c.seq != 0) break;
    len += c.len, ++nt;
  }
  if (nt == 0) return {};
  const ChunkGrid g{len, nt, chunks[0].t0};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkInfo a = grid_entry(g, int(i)), &e = chunks[i];
    if (a.seq != e.seq || a.t0 != e.t0 || a.len != e.len || a.index_in_seq != e.index_in_seq) return {};
  }
  return g;
}

}  // namespace kcp::cuda
