// Files, groups, errors and attributes of the HDF5 layer (datasets are in h5_dataset.cpp).
#include "io/h5.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "io/progress.h"

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

struct Link {
  std::string name;
  H5L_type_t type;
};

std::vector<Link> links_of(hid_t group, bool& ok) {
  std::vector<Link> links;
  auto cb = [](hid_t, const char* name, const H5L_info_t* info, void* op) -> herr_t {
    static_cast<std::vector<Link>*>(op)->push_back({name, info ? info->type : H5L_TYPE_ERROR});
    return 0;
  };
  hsize_t idx = 0;
  ok = H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &links) >= 0;
  return links;
}

// Where a soft or external link points, for the message.
std::string link_target(hid_t group, const Link& l) {
  H5L_info_t info;
  if (H5Lget_info(group, l.name.c_str(), &info, H5P_DEFAULT) < 0 || info.u.val_size > 4096) return "?";
  std::string buf(info.u.val_size + 1, '\0');
  if (H5Lget_val(group, l.name.c_str(), buf.data(), buf.size(), H5P_DEFAULT) < 0) return "?";
  if (l.type == H5L_TYPE_SOFT) return "'" + std::string(buf.c_str()) + "'";
  const char *file = nullptr, *path = nullptr;
  unsigned flags = 0;
  if (H5Lunpack_elink_val(buf.data(), buf.size(), &flags, &file, &path) < 0 || !file || !path) return "?";
  return "'" + std::string(path) + "' in file '" + file + "'";
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
  note_reading(where);
  H5Id a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (a.get() < 0) h5_fail(where, "cannot open the attribute");
  H5Id ft(H5Aget_type(a.get()), H5Tclose);
  H5Id sp(H5Aget_space(a.get()), H5Sclose);
  const H5S_class_t sc = H5Sget_simple_extent_type(sp.get());
  if (sc == H5S_NULL) return Unsupported{"an empty attribute"};
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  const hssize_t n = H5Sget_simple_extent_npoints(sp.get());
  // kcp's attributes are scalars and short vectors: a large one is a damaged or crafted header
  KCP_CHECK(n >= 0 && n <= (1 << 16), where, ": ", n, " elements (attributes hold at most 65536)");
  KCP_CHECK(H5Tget_size(ft.get()) <= (size_t(1) << 20), where, ": elements of ", H5Tget_size(ft.get()),
            " bytes (attributes hold at most 1 MiB per element)");
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
    // Fixed-length, NUL-terminated: stored in the (checksummed) object header, not in the global heap
    // that variable-length strings use, which has no checksum.
    ftype = H5Id(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(ftype.get(), s->size() + 1);
    H5Tset_cset(ftype.get(), H5T_CSET_UTF8);
    mtype = H5Id(H5Tcopy(ftype.get()), H5Tclose);
    cstr = s->c_str(), buf = cstr;
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
  if (inner.find("fletcher32") != std::string::npos || inner.find("checksum") != std::string::npos)
    throw Error(where + ": corrupt: a checksum does not match (flipped bits in the file?) (HDF5: " + inner + ")");
  throw Error(where + ": " + what + (inner.empty() ? "" : " (HDF5: " + inner + ")"));
}

namespace {

// Why `path` cannot be read as a dump file, or "" when it is a readable regular file. Checked before
// HDF5 sees it: H5Fis_hdf5 on a FIFO would block, and its answer for a directory or an unreadable
// file is "not HDF5".
std::string unreadable_reason(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec == std::errc::too_many_symbolic_link_levels) return "a symbolic link loop";
  if (ec == std::errc::permission_denied) return "permission denied (on a folder of its path)";
  if (ec || st.type() == fs::file_type::not_found) {
    std::error_code lec;
    if (fs::is_symlink(fs::symlink_status(path, lec))) return "a symbolic link to a missing file";
    return "no such file";
  }
  switch (st.type()) {
    case fs::file_type::regular: break;
    case fs::file_type::directory: return "a directory, expected an HDF5 file";
    case fs::file_type::fifo: return "a FIFO (named pipe), expected an HDF5 file";
    case fs::file_type::socket: return "a socket, expected an HDF5 file";
    case fs::file_type::character:
    case fs::file_type::block: return "a device, expected an HDF5 file";
    default: return "not a regular file";
  }
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return "";
  }
  return errno == EACCES ? "permission denied (cannot open it for reading)" : "cannot open: " + std::string(std::strerror(errno));
}

}  // namespace

H5Id file_open_read(const std::string& path) {
  silence_hdf5();
  note_reading(path);
  const std::string why = unreadable_reason(path);
  KCP_CHECK(why.empty(), path, ": ", why);
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
  // The 1.10 file format: superblock, object headers and chunk indexes carry checksums, so a flipped
  // bit in the metadata is an error too (readable by HDF5 >= 1.10 and h5py).
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110);
  H5Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
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

ObjectInfo object_info(hid_t obj, const std::string& where) {
  ObjectInfo o;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  if (H5Oget_info3(obj, &info, H5O_INFO_BASIC) < 0) h5_fail(where, "cannot read the object header");
  o.key = std::to_string(info.fileno) + ":" + std::string(reinterpret_cast<const char*>(&info.token), sizeof info.token);
#else
  H5O_info_t info;
  if (H5Oget_info2(obj, &info, H5O_INFO_BASIC) < 0) h5_fail(where, "cannot read the object header");
  o.key = std::to_string(info.fileno) + ":" + std::to_string(info.addr);
#endif
  o.links = info.rc;
  return o;
}

void check_linked_once(hid_t obj, const std::string& where) {
  const ObjectInfo o = object_info(obj, where);
  KCP_CHECK(o.links <= 1, where, ": reachable through ", o.links, " hard links (a cycle or a shared object); a kcp "
            "dump holds each group and dataset once");
}

Members group_members(hid_t group, const std::string& where) {
  note_reading(where);
  Members m;
  bool ok = true;
  const std::vector<Link> links = links_of(group, ok);
  if (!ok) h5_fail(where, "cannot list the group's members");
  for (const Link& l : links) {
    const std::string at = (where.ends_with("/") ? where : where + "/") + l.name;
    KCP_CHECK(l.type != H5L_TYPE_SOFT, at, ": a soft link (to ", link_target(group, l), "); a kcp dump holds no links");
    KCP_CHECK(l.type != H5L_TYPE_EXTERNAL, at, ": an external link (to ", link_target(group, l),
              "); kcp reads nothing outside the dump");
    KCP_CHECK(l.type == H5L_TYPE_HARD, at, ": a user-defined link; a kcp dump holds no links");
    note_reading(at);
    H5Id obj(H5Oopen(group, l.name.c_str(), H5P_DEFAULT), H5Oclose);
    if (obj.get() < 0) h5_fail(at, "cannot open the object (dangling link or damaged file?)");
    check_linked_once(obj.get(), at);
    const H5I_type_t t = H5Iget_type(obj.get());
    if (t == H5I_GROUP) m.groups.push_back(l.name);
    else if (t == H5I_DATASET) m.datasets.push_back(l.name);
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
