// A kcp dump in memory: root attributes, then groups of datasets (schema: docs/DUMP_FORMAT.md).
//   /inputs/<name>       the operator's inputs and cotangents (do, dht) as passed on this rank
//   /<producer>/<name>   outputs and gradients of one producer (fla_chunk, fla_naive, a kcp backend)
//   /layer/..., /debug/  optional captures kcp lists but does not judge
// dump_read() accepts format "kcp-dump" versions 1 and 2; dump_write() writes version 2 to a
// temporary name next to the target and renames it on success, so no partial file is ever left.
// dump_read runs in the calling process and bounds what a file can make it allocate (io/limits.h),
// but the HDF5 library underneath is not hardened: a corrupt file can crash or hang it. Read files
// from untrusted sources in a child process, as the kcp programs do (app/isolate.h).
// Covered by tests/io/test_dump.cpp and tests/io/test_hostile.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "io/h5.h"

namespace kcp::io {

inline constexpr std::string_view kDumpFormat = "kcp-dump";
inline constexpr int64_t kDumpVersion = 2;  // the version dump_write() writes; 1 stays readable

struct DumpDataset {
  std::string name;
  Array data;                        // as stored (bf16 forms as bf16 bits, goldens as float32)
  DType source = DType::f32;         // the producer's dtype (attribute dtype)
  Encoding encoding = Encoding::ieee;
  Attributes attrs;                  // every attribute, dtype and encoding included
};

struct DumpGroup {
  std::string name;                  // path below the root without the leading '/': "inputs", "layer/params"
  Attributes attrs;
  std::vector<DumpDataset> datasets;
  const DumpDataset* find(std::string_view dataset) const;
  DumpDataset& add(std::string name, Array data, DType source, Encoding encoding = Encoding::ieee);
};

struct Dump {
  std::string path;                  // where it was read from (messages name it)
  Attributes attrs;                  // root attributes
  int64_t version = kDumpVersion;
  std::string op;                    // gdn, kda, gla or conv1d
  std::vector<DumpGroup> groups;     // in file order (HDF5 name order)

  const DumpGroup* group(std::string_view name) const;
  // /inputs, or an error naming the file (a layer capture may hold only /layer).
  const DumpGroup& inputs() const;
  DumpGroup& add_group(std::string name);   // replaces a group of the same name
  std::vector<const DumpGroup*> result_groups() const;  // every group but inputs, layer*, debug*
};

// Known ops; an unknown op in a file is an error naming the file.
bool op_known(std::string_view op);
// True for the groups that hold no results: inputs, layer, layer/..., debug, debug/...
bool group_is_reserved(std::string_view name);

Dump dump_read(const std::string& path);
void dump_write(const std::string& path, const Dump& d);

// Typed access to attributes; each error names `where` and the attribute.
const AttrValue* attr_find(const Attributes& a, const std::string& key);
std::string attr_string(const Attributes& a, const std::string& key, const std::string& where,
                        const std::string& fallback);
bool attr_flag(const Attributes& a, const std::string& key, const std::string& where, bool fallback);
double attr_number(const Attributes& a, const std::string& key, const std::string& where, double fallback);
int64_t attr_int(const Attributes& a, const std::string& key, const std::string& where, int64_t fallback);

}  // namespace kcp::io
