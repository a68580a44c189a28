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

// An Array of `t` holding a Tensor<double>'s values (rounded RNE for bf16/f16).
io::Array array_of(const Tensor<double>& x, DType t);

}  // namespace kcp::test
