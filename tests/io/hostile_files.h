// Hostile dumps, made with the HDF5 C API where kcp's own writer cannot make them: each kind is a
// small file that once crashed kcp, read what it should not, used unbounded memory, or was silently
// accepted (issue 17). Used by tests/io/test_hostile.cpp (in-process, also under ASan/UBSan),
// tests/validation/test_cli.cpp (through `kcp`, exit 2 and no output file) and the fuzz harness
// (tests/fuzz/) as seeds. Every kind is deterministic (seeded good dump, fixed patches).
#pragma once

#include <string>
#include <vector>

namespace kcp::test {

struct HostileKind {
  std::string name;    // file name stem, e.g. "cu_seqlens_2p21"
  std::string path;    // where make_hostile_files wrote it
  std::string expect;  // what the one-line error must contain after "<path>: "
};

// Writes every hostile kind into `dir` (existing) and returns them. `passwd` is a file outside the
// dump that the external-storage kind points at (its bytes must never be read).
std::vector<HostileKind> make_hostile_files(const std::string& dir);

// The good dump the kinds are made from (gdn, seqlens {9, 4}, K 8, V 4, with do/dht).
void write_good_dump(const std::string& path);

}  // namespace kcp::test
