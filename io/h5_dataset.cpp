// Datasets of the HDF5 layer: element-type recognition in the reader order of docs/DUMP_FORMAT.md section 3, whole-array
// read and write, and the owning Array. bf16 in either 16-bit form is read and written with memory
// type == file type (no HDF5 conversion); the float32 form is widened exactly in our code.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "core/error.h"
#include "io/h5.h"
#include "io/limits.h"
#include "io/progress.h"

namespace kcp::io {
namespace {

// A 2-byte float type: sign 15, exponent at mantissa bits with `ebits` bits, given bias.
H5Id float16_type(size_t ebits, size_t mbits, size_t bias) {
  H5Id t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
  H5Tset_fields(t.get(), 15, mbits, ebits, 0, mbits);
  H5Tset_size(t.get(), 2);
  H5Tset_ebias(t.get(), bias);
  return t;
}
H5Id ieee_half_type() { return float16_type(5, 10, 15); }

// What a dataset's file type and `dtype` attribute say about its contents.
struct TypeChoice {
  DType stored;       // element type in memory after reading
  DType source;       // the producer's dtype
  Encoding encoding;
  H5Id mem;           // memory type to read with
};

std::string dtype_attr(const Attributes& a, const std::string& where) {
  auto it = a.find("dtype");
  if (it == a.end()) return "";
  const std::string* s = std::get_if<std::string>(&it->second);
  KCP_CHECK(s, where, ": attribute dtype: expected a string such as 'bfloat16', got ", attr_describe(it->second));
  return *s;
}

H5Id copy_of(hid_t t) { return H5Id(H5Tcopy(t), H5Tclose); }

TypeChoice choose_float(hid_t ft, const std::string& label, const std::string& where) {
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize);
  const size_t size = H5Tget_size(ft), bias = H5Tget_ebias(ft);
  if (size == 2 && esize == 8 && msize == 7 && bias == 127)
    return {DType::bf16, DType::bf16, Encoding::bf16_float, bf16_float_type()};
  if (size == 2 && esize == 5 && msize == 10 && bias == 15)
    return {DType::f16, DType::f16, Encoding::ieee, ieee_half_type()};
  if (size == 4 && esize == 8 && msize == 23) {
    const DType src = label.empty() ? DType::f32 : dtype_parse(label);
    return {DType::f32, src, Encoding::ieee, copy_of(H5T_NATIVE_FLOAT)};
  }
  if (size == 8 && esize == 11 && msize == 52) {
    const DType src = label.empty() ? DType::f64 : dtype_parse(label);
    return {DType::f64, src, Encoding::ieee, copy_of(H5T_NATIVE_DOUBLE)};
  }
  throw Error(detail::concat(where, ": unsupported float layout (", size, " bytes, ", esize,
                             "-bit exponent with bias ", bias, ", ", msize, "-bit mantissa); bfloat16 needs ",
                             "an 8-bit exponent with bias 127, float16 a 5-bit one with bias 15"));
}

TypeChoice choose_type(hid_t ft, const std::string& label, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(ft);
  const size_t size = H5Tget_size(ft);
  const bool bits16 = size == 2 && (label == "bfloat16" || label == "float16" || label == "torch.bfloat16" ||
                                    label == "torch.float16");
  if (cls == H5T_FLOAT) return choose_float(ft, label, where);
  if ((cls == H5T_INTEGER || cls == H5T_OPAQUE) && bits16) {  // bit patterns named by the attribute
    const DType t = dtype_parse(label);
    return {t, t, t == DType::bf16 ? Encoding::bf16_bits : Encoding::ieee,
            cls == H5T_OPAQUE ? copy_of(ft) : copy_of(H5T_NATIVE_UINT16)};
  }
  if (cls == H5T_INTEGER && size == 2 && H5Tget_sign(ft) == H5T_SGN_NONE && label.empty())
    throw Error(where + ": a 2-byte integer dataset needs attribute dtype = 'bfloat16' or 'float16' to be read "
                "as floats (kcp dumps hold no uint16 data)");
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(ft) == H5T_SGN_2;
    if (size == 4 && is_signed) return {DType::i32, DType::i32, Encoding::ieee, copy_of(H5T_NATIVE_INT32)};
    KCP_CHECK(size < 8 || is_signed, where, ": unsigned 64-bit integers are not supported (use int64)");
    return {DType::i64, DType::i64, Encoding::ieee, copy_of(H5T_NATIVE_INT64)};
  }
  if (cls == H5T_OPAQUE)
    throw Error(where + ": an opaque dataset needs size 2 and attribute dtype = 'bfloat16' or 'float16'");
  throw Error(where + ": unsupported HDF5 type class for a tensor (expected float, integer or 16-bit bits)");
}

Shape read_shape(hid_t ds, const std::string& where) {
  H5Id sp(H5Dget_space(ds), H5Sclose);
  if (sp.get() < 0) h5_fail(where, "cannot read the dataspace");
  KCP_CHECK(H5Sget_simple_extent_type(sp.get()) != H5S_NULL, where, ": the dataset is empty (null dataspace)");
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  KCP_CHECK(rank >= 0 && rank <= 8, where, ": unsupported rank ", rank);
  hsize_t dims[8] = {};
  H5Sget_simple_extent_dims(sp.get(), dims, nullptr);
  Shape s(static_cast<size_t>(rank));
  double total = 1;
  for (int i = 0; i < rank; ++i) s[size_t(i)] = int64_t(dims[i]), total *= double(dims[i]);
  KCP_CHECK(total < double(int64_t(1) << 34), where, ": ", shape_str(s), " has too many elements");
  return s;
}

// Data must live in this file, as an ordinary dataset: external raw storage (H5Pset_external) and
// virtual datasets would make kcp read other files (e.g. /etc/passwd as /inputs/q).
void check_storage_kind(hid_t ds, const std::string& where) {
  H5Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (dcpl.get() < 0) h5_fail(where, "cannot read the dataset's creation properties");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  KCP_CHECK(layout != H5D_VIRTUAL, where, ": a virtual dataset (its data lives in other files); kcp reads data "
            "stored in the dump itself");
  KCP_CHECK(H5Pget_external_count(dcpl.get()) == 0, where, ": external raw storage (the data lives in another "
            "file); kcp reads data stored in the dump itself");
}

// Before allocating: the declared size must fit the memory budget and what the file can hold. A
// deflate stream expands at most ~1032:1, so more than 1100x the stored bytes (plus 1 MiB for small
// fill-value datasets) is a header that lies about the size.
void check_declared_size(hid_t ds, const Shape& s, DType t, const std::string& where, MemoryBudget* budget) {
  const int64_t bytes = checked_bytes(s, dtype_size(t), where);
  const int64_t stored = int64_t(H5Dget_storage_size(ds));
  H5Id fid(H5Iget_file_id(ds), H5Fclose);
  hsize_t file_size = 0;
  if (fid.get() >= 0) H5Fget_filesize(fid.get(), &file_size);
  KCP_CHECK(file_size == 0 || stored <= int64_t(file_size), where, ": the header says ", bytes_str(double(stored)),
            " of data are stored, but the file is only ", bytes_str(double(file_size)), " (damaged file?)");
  KCP_CHECK(bytes <= stored * 1100 + (int64_t(1) << 20), where, ": declares ", shape_str(s), " (",
            bytes_str(double(bytes)), ") but the file stores only ", bytes_str(double(stored)),
            " of it (damaged or crafted file?)");
  if (budget) budget->add(where, bytes, "declared " + shape_str(s) + " " + std::string(dtype_name(t)));
}

// A float32/float64 dataset labelled bfloat16 or float16 must hold values of that type.
void check_label_exact(const Array& a, DType label, const std::string& where) {
  if (a.dtype == label || !(label == DType::bf16 || label == DType::f16) || !dtype_is_float(a.dtype)) return;
  const Tensor<double> x = to_tensor<double>(a.view());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data()[i];
    KCP_CHECK(std::isnan(v) || round_to(label, v) == v, where, ": labelled ", dtype_name(label), " (attribute dtype) "
              "but stored ", dtype_name(a.dtype), " value ", v, " at flat index ", i, " is not a ", dtype_name(label),
              " value");
  }
}

// Chunked storage with HDF5's Fletcher32 filter, so a flipped bit in the data fails the read instead
// of being judged as numbers. Chunks of at most 2^20 elements: whole trailing dimensions, then a slice
// of the next. Scalars and empty datasets stay contiguous (nothing to checksum).
H5Id checksummed_layout(const std::vector<hsize_t>& dims) {
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  if (dims.empty() || total == 0) return dcpl;
  std::vector<hsize_t> chunk(dims.size(), 1);
  hsize_t n = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    const hsize_t take = std::min<hsize_t>(dims[i], std::max<hsize_t>((hsize_t(1) << 20) / n, 1));
    chunk[i] = take, n *= take;
    if (take < dims[i]) break;
  }
  H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
  H5Pset_fletcher32(dcpl.get());
  return dcpl;
}

}  // namespace

Array::Array(DType t, Shape s)
    : dtype(t), shape(std::move(s)), storage((size_t(shape_numel(shape)) * size_t(dtype_size(t)) + 7) / 8, 0) {}

TensorView Array::view() const { return TensorView(const_cast<uint64_t*>(storage.data()), dtype, shape); }

Array array_from_view(const TensorView& v) {
  KCP_CHECK(v.device == Device::host, "array_from_view: the view must be in host memory");
  Array a(v.dtype, v.shape);
  if (v.contiguous()) {
    if (a.nbytes()) std::memcpy(a.data(), v.data, a.nbytes());
    return a;
  }
  const Tensor<double> t = to_tensor<double>(v);  // exact for every dtype (bf16/f16/f32 widen exactly)
  view_store<double>(a.view(), 0, t.numel(), 1, t.data());
  return a;
}

Array array_convert(const Array& a, DType to) {
  if (a.dtype == to) return a;
  Array out(to, a.shape);
  if (to == DType::i64) {  // through int64, so all 64 bits survive
    const Tensor<int64_t> t = to_tensor<int64_t>(a.view());
    if (out.nbytes()) std::memcpy(out.data(), t.data(), out.nbytes());
    return out;
  }
  const Tensor<double> t = to_tensor<double>(a.view());  // widening is exact; narrowing rounds (RNE)
  view_store<double>(out.view(), 0, t.numel(), 1, t.data());
  return out;
}

std::string_view encoding_name(Encoding e) {
  switch (e) {
    case Encoding::ieee: return "ieee";
    case Encoding::bf16_float: return "bf16_float";
    case Encoding::bf16_bits: return "bf16_bits";
  }
  return "?";
}

H5Id bf16_float_type() { return float16_type(8, 7, 127); }

StoredArray dataset_read(hid_t loc, const std::string& name, const std::string& where, MemoryBudget* budget) {
  note_reading(where);
  H5Id ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) h5_fail(where, "cannot open the dataset");
  H5Id ft(H5Dget_type(ds.get()), H5Tclose);
  if (ft.get() < 0) h5_fail(where, "cannot read the element type");
  check_storage_kind(ds.get(), where);
  StoredArray out;
  out.attrs = attrs_read(ds.get(), where);
  const std::string label = dtype_attr(out.attrs, where);
  TypeChoice c = [&] {
    try {
      return choose_type(ft.get(), label, where);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.rfind(where, 0) == 0) throw;
      throw Error(where + ": attribute dtype: " + msg);  // dtype_parse's message about the label
    }
  }();
  const Shape shape = read_shape(ds.get(), where);
  check_declared_size(ds.get(), shape, c.stored, where, budget);
  try {
    out.data = Array(c.stored, shape);
  } catch (const std::bad_alloc&) {
    throw Error(detail::concat(where, ": cannot allocate ", shape_str(shape), " ", dtype_name(c.stored),
                               " (out of memory)"));
  }
  out.source = c.source;
  out.encoding = c.encoding;
  note_reading(where);  // the attributes are read; now the data
  if (out.data.numel() > 0 && H5Dread(ds.get(), c.mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data.data()) < 0)
    h5_fail(where, "cannot read the data (corrupt, truncated or damaged file?)");
  check_label_exact(out.data, out.source, where);
  return out;
}

void dataset_write(hid_t loc, const std::string& name, const Array& a, DType source, Encoding encoding,
                   const Attributes& extra, const std::string& where) {
  KCP_CHECK(encoding == Encoding::ieee || a.dtype == DType::bf16, where, ": encoding ", encoding_name(encoding),
            " applies to bfloat16 data only, not ", dtype_name(a.dtype));
  const Array* src = &a;
  Array widened;
  H5Id ftype, mtype;
  switch (a.dtype) {
    case DType::f64: ftype = copy_of(H5T_IEEE_F64LE), mtype = copy_of(H5T_NATIVE_DOUBLE); break;
    case DType::f32: ftype = copy_of(H5T_IEEE_F32LE), mtype = copy_of(H5T_NATIVE_FLOAT); break;
    case DType::i32: ftype = copy_of(H5T_STD_I32LE), mtype = copy_of(H5T_NATIVE_INT32); break;
    case DType::i64: ftype = copy_of(H5T_STD_I64LE), mtype = copy_of(H5T_NATIVE_INT64); break;
    case DType::f16: ftype = ieee_half_type(), mtype = ieee_half_type(); break;
    case DType::bf16:
      if (encoding == Encoding::bf16_float) {
        ftype = bf16_float_type(), mtype = bf16_float_type();
      } else if (encoding == Encoding::bf16_bits) {
        ftype = copy_of(H5T_STD_U16LE), mtype = copy_of(H5T_NATIVE_UINT16);
      } else {  // float32 holding bf16 values: exact widening
        widened = array_convert(a, DType::f32), src = &widened;
        ftype = copy_of(H5T_IEEE_F32LE), mtype = copy_of(H5T_NATIVE_FLOAT);
      }
      break;
  }
  std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
  H5Id space = dims.empty() ? H5Id(H5Screate(H5S_SCALAR), H5Sclose)
                            : H5Id(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id dcpl = checksummed_layout(dims);
  H5Id ds(H5Dcreate2(loc, name.c_str(), ftype.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
          H5Dclose);
  if (ds.get() < 0) h5_fail(where, "cannot create the dataset");
  if (src->numel() > 0 && H5Dwrite(ds.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src->data()) < 0)
    h5_fail(where, "cannot write the data");
  Attributes attrs = extra;
  attrs["dtype"] = std::string(dtype_name(source));
  attrs["encoding"] = std::string(encoding_name(encoding));
  attrs_write(ds.get(), attrs, where);
}

}  // namespace kcp::io
