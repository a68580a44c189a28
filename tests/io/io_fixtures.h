// Shared by the io tests: a scratch folder per test, and small dumps built from seeded cases
// (validation/cases.h) so every test file can be regenerated from the printed seed.
#pragma once

#include <filesystem>
#include <string>

#include "io/dump.h"
#include "validation/cases.h"

namespace kcp::test {

// A fresh folder under the test's working directory, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name);
  ~TempDir();
  std::string file(const std::string& name) const { return (path / name).string(); }
  size_t count() const;  // entries in the folder (a failed write must leave none)
};

// A schema-v2 dump of a case's inputs and cotangents, floats stored as `stored` (bf16 in
// `encoding`), with the root attributes FLA's call would have (op, flags, scale, chunk_size).
io::Dump dump_from_case(const val::CaseData& c, DType stored = DType::f32,
                        io::Encoding encoding = io::Encoding::ieee);

// Rank `rank` of `P` of a single-rank gdn/kda dump, split as a CP/TP run would hold it: along the
// packed tokens (chunkwise CP: contiguous parts, global cu_seqlens kept with scope = "global",
// partial sums dA_log/ddt_bias as value/P, states dropped as FLA forbids them there) or along the
// heads (headwise CP / TP). Sets the placement attributes.
io::Dump dump_shard(const io::Dump& global, int64_t rank, int64_t P, bool tokens);

// An Array of `t` holding a Tensor<double>'s values (rounded RNE for bf16/f16).
io::Array array_of(const Tensor<double>& x, DType t);

}  // namespace kcp::test
