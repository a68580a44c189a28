// Files, groups, errors and attributes of the HDF5 layer (datasets are in h5_dataset.cpp).
#include "io/h5.h"

#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace kcp::io {
namespace {

// HDF5 prints its error stack to stderr by default; kcp reports one line of its own instead.
void silence_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

herr_t innermost_error(unsigned, const H5E_error2_t* e, void* out) {
  if (e && e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

std::vector<std::string> link_names(hid_t group, bool& ok) {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* op) -> herr_t {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  ok = H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names) >= 0;
  return names;
}

std::vector<std::string> attr_names(hid_t obj, bool& ok) {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* op) -> herr_t {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  ok = H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names) >= 0;
  return names;
}

// Reads a string attribute, variable- or fixed-length.
std::string read_string_attr(hid_t a, hid_t ftype, const std::string& where) {
  if (H5Tis_variable_str(ftype) > 0) {
    H5Id mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(ftype));
    char* s = nullptr;
    if (H5Aread(a, mt.get(), &s) < 0) h5_fail(where, "cannot read the string");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(ftype);
  std::string buf(n + 1, '\0');
  H5Id mt(H5Tcopy(ftype), H5Tclose);
  if (H5Aread(a, mt.get(), buf.data()) < 0) h5_fail(where, "cannot read the string");
  buf.resize(n);
  while (!buf.empty() && (buf.back() == '\0' || buf.back() == ' ')) buf.pop_back();  // NULLPAD/SPACEPAD
  if (auto z = buf.find('\0'); z != std::string::npos) buf.resize(z);               // NULLTERM
  return buf;
}

// An enum attribute: h5py's bool (members FALSE/TRUE) becomes a bool.
AttrValue read_enum_attr(hid_t a, hid_t ftype, const std::string& where) {
  H5Id mt(H5Tget_native_type(ftype, H5T_DIR_DEFAULT), H5Tclose);
  unsigned char raw[16] = {};
  if (H5Tget_size(mt.get()) > sizeof raw || H5Aread(a, mt.get(), raw) < 0) h5_fail(where, "cannot read the enum");
  char name[64] = {};
  if (H5Tenum_nameof(mt.get(), raw, name, sizeof name) < 0) return Unsupported{"an enum with an unnamed value"};
  const std::string s = name;
  if (s == "TRUE" || s == "True" || s == "true") return true;
  if (s == "FALSE" || s == "False" || s == "false") return false;
  return Unsupported{"an enum member '" + s + "'"};
}

AttrValue read_attr(hid_t obj, const std::string& name, const std::string& where) {
  H5Id a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (a.get() < 0) h5_fail(where, "cannot open the attribute");
  H5Id ft(H5Aget_type(a.get()), H5Tclose);
  H5Id sp(H5Aget_space(a.get()), H5Sclose);
  const H5S_class_t sc = H5Sget_simple_extent_type(sp.get());
  if (sc == H5S_NULL) return Unsupported{"an empty attribute"};
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  const hssize_t n = H5Sget_simple_extent_npoints(sp.get());
  const bool scalar = rank == 0 || (rank == 1 && n == 1);
  switch (H5Tget_class(ft.get())) {
    case H5T_INTEGER: {
      std::vector<int64_t> v(size_t(std::max<hssize_t>(n, 1)));
      if (H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0) h5_fail(where, "cannot read the integer");
      if (scalar) return v[0];
      if (rank == 1) return v;
      return Unsupported{"a " + std::to_string(rank) + "-d integer array"};
    }
    case H5T_FLOAT: {
      std::vector<double> v(size_t(std::max<hssize_t>(n, 1)));
      if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) h5_fail(where, "cannot read the number");
      if (scalar) return v[0];
      if (rank == 1) return v;
      return Unsupported{"a " + std::to_string(rank) + "-d float array"};
    }
    case H5T_STRING:
      if (!scalar) return Unsupported{"an array of strings"};
      return read_string_attr(a.get(), ft.get(), where);
    case H5T_ENUM:
      if (!scalar) return Unsupported{"an array of enums"};
      return read_enum_attr(a.get(), ft.get(), where);
    default: return Unsupported{"an attribute of an unsupported HDF5 type class"};
  }
}

H5Id bool_type() {
  H5Id t(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose);
  const int8_t f = 0, tr = 1;
  H5Tenum_insert(t.get(), "FALSE", &f);
  H5Tenum_insert(t.get(), "TRUE", &tr);
  return t;
}

void write_attr(hid_t obj, const std::string& name, const AttrValue& v, const std::string& where) {
  if (std::holds_alternative<Unsupported>(v)) return;  // nothing we could write back faithfully
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Id ftype, mtype, space;
  const void* buf = nullptr;
  int8_t b = 0;
  const char* cstr = nullptr;
  hsize_t n = 1;
  if (const bool* x = std::get_if<bool>(&v)) {
    b = *x ? 1 : 0, ftype = bool_type(), mtype = bool_type(), buf = &b;
  } else if (const int64_t* i = std::get_if<int64_t>(&v)) {
    ftype = H5Id(H5Tcopy(H5T_STD_I64LE), H5Tclose), mtype = H5Id(H5Tcopy(H5T_NATIVE_INT64), H5Tclose), buf = i;
  } else if (const double* d = std::get_if<double>(&v)) {
    ftype = H5Id(H5Tcopy(H5T_IEEE_F64LE), H5Tclose), mtype = H5Id(H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose), buf = d;
  } else if (const std::string* s = std::get_if<std::string>(&v)) {
    ftype = H5Id(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(ftype.get(), H5T_VARIABLE);
    H5Tset_cset(ftype.get(), H5T_CSET_UTF8);
    mtype = H5Id(H5Tcopy(ftype.get()), H5Tclose);
    cstr = s->c_str(), buf = &cstr;
  } else if (const auto* vi = std::get_if<std::vector<int64_t>>(&v)) {
    ftype = H5Id(H5Tcopy(H5T_STD_I64LE), H5Tclose), mtype = H5Id(H5Tcopy(H5T_NATIVE_INT64), H5Tclose);
    n = vi->size(), buf = vi->data();
  } else if (const auto* vd = std::get_if<std::vector<double>>(&v)) {
    ftype = H5Id(H5Tcopy(H5T_IEEE_F64LE), H5Tclose), mtype = H5Id(H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose);
    n = vd->size(), buf = vd->data();
  }
  const bool vec = std::holds_alternative<std::vector<int64_t>>(v) || std::holds_alternative<std::vector<double>>(v);
  space = vec ? H5Id(H5Screate_simple(1, &n, nullptr), H5Sclose) : H5Id(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id a(H5Acreate2(obj, name.c_str(), ftype.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.get() < 0 || H5Awrite(a.get(), mtype.get(), buf) < 0) h5_fail(where + " attribute " + name, "cannot write");
}

}  // namespace

void h5_fail(const std::string& where, const std::string& what) {
  std::string inner;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost_error, &inner);
  H5Eclear2(H5E_DEFAULT);
  throw Error(where + ": " + what + (inner.empty() ? "" : " (HDF5: " + inner + ")"));
}

H5Id file_open_read(const std::string& path) {
  silence_hdf5();
  std::error_code ec;
  KCP_CHECK(std::filesystem::is_regular_file(path, ec), path, ": no such file");
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw Error(path + ": not an HDF5 file (or its superblock is unreadable)");
  }
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) h5_fail(path, "cannot open the HDF5 file (truncated or damaged?)");
  return f;
}

H5Id file_create(const std::string& path) {
  silence_hdf5();
  H5Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) h5_fail(path, "cannot create the file");
  return f;
}

H5Id group_open(hid_t loc, const std::string& name, const std::string& where) {
  H5Id g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) h5_fail(where, "cannot open the group");
  return g;
}

H5Id group_create(hid_t loc, const std::string& name, const std::string& where) {
  H5Id g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) h5_fail(where, "cannot create the group");
  return g;
}

Members group_members(hid_t group, const std::string& where) {
  Members m;
  bool ok = true;
  const std::vector<std::string> names = link_names(group, ok);
  if (!ok) h5_fail(where, "cannot list the group's members");
  for (const std::string& name : names) {
    H5Id obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (obj.get() < 0) h5_fail(where + "/" + name, "cannot open the object (dangling link or damaged file?)");
    const H5I_type_t t = H5Iget_type(obj.get());
    if (t == H5I_GROUP) m.groups.push_back(name);
    else if (t == H5I_DATASET) m.datasets.push_back(name);
  }
  return m;
}

std::string attr_describe(const AttrValue& v) {
  std::ostringstream os;
  std::visit([&](const auto& x) {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<T, bool>) os << "the boolean " << (x ? "TRUE" : "FALSE");
    else if constexpr (std::is_same_v<T, int64_t>) os << "the integer " << x;
    else if constexpr (std::is_same_v<T, double>) os << "the number " << x;
    else if constexpr (std::is_same_v<T, std::string>) os << "the string '" << x << "'";
    else if constexpr (std::is_same_v<T, std::vector<int64_t>>) os << "an integer array of " << x.size();
    else if constexpr (std::is_same_v<T, std::vector<double>>) os << "a number array of " << x.size();
    else os << x.what;
  }, v);
  return os.str();
}

Attributes attrs_read(hid_t obj, const std::string& where) {
  bool ok = true;
  const std::vector<std::string> names = attr_names(obj, ok);
  if (!ok) h5_fail(where, "cannot list the attributes");
  Attributes out;
  for (const std::string& n : names) out[n] = read_attr(obj, n, where + " attribute " + n);
  return out;
}

void attrs_write(hid_t obj, const Attributes& attrs, const std::string& where) {
  for (const auto& [name, v] : attrs) write_attr(obj, name, v, where);
}

}  // namespace kcp::io
