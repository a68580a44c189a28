// A thin RAII layer over the HDF5 C API: identifiers that close themselves, every failed call turned
// into one kcp::Error naming the file and the object ("x.h5: /inputs/q: cannot read (HDF5: ...)"),
// and typed read/write of attributes and of whole datasets. Tensor element types (docs/DUMP_FORMAT.md section 3):
//   float64, float32, int32, int64: IEEE / two's complement, little-endian in files we write;
//   float16: 2-byte float, 5-bit exponent (what numpy/h5py write);
//   bfloat16: (a) 2-byte float with an 8-bit exponent, bias 127 ("bf16_float"), (b) uint16 or 2-byte
//   opaque bits with attribute dtype = "bfloat16" ("bf16_bits"), (c) float32 with that attribute.
// bf16 data moves through HDF5 with memory type == file type, so HDF5 never rounds it.
// Covered by tests/io/test_h5.cpp (also built with AddressSanitizer as test_io_asan).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"

namespace kcp::io {

// One HDF5 identifier and the function that closes it.
class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Id(H5Id&& o) noexcept { swap(o); }
  H5Id& operator=(H5Id&& o) noexcept { swap(o); return *this; }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { if (id_ >= 0 && close_) close_(id_); }
  hid_t get() const { return id_; }

 private:
  void swap(H5Id& o) { std::swap(id_, o.id_), std::swap(close_, o.close_); }
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Throws kcp::Error("<where>: <what> (HDF5: <innermost message of the error stack>)").
[[noreturn]] void h5_fail(const std::string& where, const std::string& what);

// Files and groups. `where` prefixes every error message.
H5Id file_open_read(const std::string& path);
H5Id file_create(const std::string& path);
H5Id group_open(hid_t loc, const std::string& name, const std::string& where);
H5Id group_create(hid_t loc, const std::string& name, const std::string& where);
struct Members {
  std::vector<std::string> groups, datasets;  // in HDF5's name order
};
// Refuses soft, external and user-defined links and any object with more than one hard link (so a
// group can never contain itself), each with one line naming the path.
Members group_members(hid_t group, const std::string& where);
struct ObjectInfo {
  std::string key;    // identifies the object within the open files (file number + address/token)
  unsigned links = 0;  // hard links to it
};
ObjectInfo object_info(hid_t obj, const std::string& where);
void check_linked_once(hid_t obj, const std::string& where);  // the error group_members gives

// Attribute values kcp understands; anything else is kept as Unsupported (read, never fatal
// unless the reader needs that attribute).
struct Unsupported {
  std::string what;  // "a 3-d float array", "a compound type", ...
  bool operator==(const Unsupported&) const = default;
};
using AttrValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, Unsupported>;
using Attributes = std::map<std::string, AttrValue>;
std::string attr_describe(const AttrValue& v);  // "the string 'yes'", "the integer 3", ...

Attributes attrs_read(hid_t obj, const std::string& where);
// Writes bool as h5py does (enum FALSE/TRUE over int8), strings as fixed-length NUL-terminated UTF-8
// (inside the checksummed object header).
void attrs_write(hid_t obj, const Attributes& attrs, const std::string& where);

// An owning, contiguous host array of any DType (bf16/f16 hold their 16-bit patterns).
struct Array {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<uint64_t> storage;  // 8-byte aligned backing store
  Array() = default;
  Array(DType t, Shape s);
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * size_t(dtype_size(dtype)); }
  void* data() { return storage.data(); }
  const void* data() const { return storage.data(); }
  TensorView view() const;  // host view of this array
};
Array array_from_view(const TensorView& host_view);  // exact copy in the view's dtype
// Through double; narrowing rounds to nearest even (from float64 to bf16/f16 it rounds twice, via
// float32: a value within half a float32 ulp (2^-24 relative) of a bf16 tie may round the other way).
Array array_convert(const Array& a, DType to);

// How a dataset is (to be) stored in the file.
enum class Encoding {
  ieee,        // standard IEEE/integer type; a bf16 array is widened exactly to float32
  bf16_float,  // 2-byte HDF5 float type, 8-bit exponent, bias 127
  bf16_bits,   // uint16 bit patterns (attribute dtype = "bfloat16")
};
std::string_view encoding_name(Encoding e);

struct StoredArray {
  Array data;        // in the stored element type (bf16 forms as DType::bf16 bits)
  DType source;      // the dtype the tensor had where it was produced (attribute dtype, else data.dtype)
  Encoding encoding;
  Attributes attrs;  // all attributes of the dataset, dtype and encoding included
};
struct MemoryBudget;  // io/limits.h
// Refuses external raw storage and virtual datasets, a declared size the file cannot hold or the
// budget (when given) cannot pay for, and float data labelled bf16/f16 that is not of that type.
StoredArray dataset_read(hid_t loc, const std::string& name, const std::string& where,
                         MemoryBudget* budget = nullptr);
// Writes `a` in `encoding` (bf16 arrays only may use the bf16 forms). Sets attributes dtype
// (= `source`) and encoding, plus `extra`.
void dataset_write(hid_t loc, const std::string& name, const Array& a, DType source, Encoding encoding,
                   const Attributes& extra, const std::string& where);

// The 2-byte float type of form (a), little-endian; owned by the caller.
H5Id bf16_float_type();

}  // namespace kcp::io
