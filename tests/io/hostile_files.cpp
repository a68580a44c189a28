// make_hostile_files (see hostile_files.h).
#include "tests/io/hostile_files.h"

#include <hdf5.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "io/dump.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"

namespace kcp::test {
namespace {

io::Dump good() {
  val::CaseSpec s;
  s.variant = Variant::gdn, s.seqlens = {9, 4}, s.K = 8, s.V = 4, s.seed = 7;
  return dump_from_case(val::make_case(s));
}

void must(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("make_hostile_files: " + what);
}

// Opens `path` read-write and hands the file to `patch`.
void patch_file(const std::string& path, const std::function<void(hid_t)>& patch) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  io::H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  must(f.get() >= 0, "cannot open " + path);
  patch(f.get());
}

// A chunked, deflated dataset of `type` with dims and (optionally) data: big declared sizes stay small files.
void put(hid_t loc, const char* name, hid_t type, std::vector<hsize_t> dims, const void* data, bool write = true) {
  io::H5Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  io::H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  std::vector<hsize_t> chunk(dims.size(), 1);
  for (size_t i = dims.size(), n = 1; i-- > 0;) {  // up to 2^16 elements per chunk, trailing dimensions first
    chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(dims[i], (hsize_t(1) << 16) / n));
    n *= chunk[i];
    if (chunk[i] < dims[i]) break;
  }
  H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
  H5Pset_deflate(dcpl.get(), 9);
  if (H5Lexists(loc, name, H5P_DEFAULT) > 0) H5Ldelete(loc, name, H5P_DEFAULT);
  io::H5Id ds(H5Dcreate2(loc, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  must(ds.get() >= 0, std::string("cannot create ") + name);
  if (write) must(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "cannot write");
}

// cu_seqlens with 2^21 + 1 entries, HV = 2^20, K = 2^16, V = 16: N*HV*K*V*8 = 2^64 wrapped to 0
// bytes and the backends wrote the final state past an 8-byte buffer (heap overflow; a 0.2 MB file).
void heap_overflow(const std::string& path) {
  io::Dump d;
  d.op = "gdn";
  d.attrs = {{"op", std::string("gdn")}};
  d.add_group("inputs");
  io::dump_write(path, d);
  patch_file(path, [](hid_t f) {
    io::H5Id in(H5Gopen2(f, "inputs", H5P_DEFAULT), H5Gclose);
    const std::vector<float> qk(size_t(1) << 16, 0.0f), v(size_t(1) << 24, 0.0f), g(size_t(1) << 20, -0.1f),
        beta(size_t(1) << 20, 0.5f);
    std::vector<int64_t> cu((size_t(1) << 21) + 1, 0);
    cu.back() = 1;
    for (const char* n : {"q", "k"}) put(in.get(), n, H5T_NATIVE_FLOAT, {1, 1, 1, 1 << 16}, qk.data());
    put(in.get(), "v", H5T_NATIVE_FLOAT, {1, 1, 1 << 20, 16}, v.data());
    put(in.get(), "g", H5T_NATIVE_FLOAT, {1, 1, 1 << 20}, g.data());
    put(in.get(), "beta", H5T_NATIVE_FLOAT, {1, 1, 1 << 20}, beta.data());
    put(in.get(), "cu_seqlens", H5T_NATIVE_INT64, {cu.size()}, cu.data());
  });
}

}  // namespace

void write_good_dump(const std::string& path) { io::dump_write(path, good()); }

std::vector<HostileKind> make_hostile_files(const std::string& dir) {
  std::vector<HostileKind> out;
  auto add = [&](const std::string& name, const std::string& expect) -> std::string {
    out.push_back({name, dir + "/" + name + ".h5", expect});
    return out.back().path;
  };
  auto from_good = [&](const std::string& name, const std::string& expect, const std::function<void(io::Dump&)>& m) {
    io::Dump d = good();
    m(d);
    io::dump_write(add(name, expect), d);
  };
  auto input = [](io::Dump& d, const char* n) -> io::DumpDataset& {
    for (io::DumpDataset& ds : d.groups.at(0).datasets)
      if (ds.name == n) return ds;
    throw std::runtime_error(std::string("no input ") + n);
  };
  const std::string passwd = dir + "/outside.txt";
  std::ofstream(passwd) << "root:x:0:0:root:/root:/bin/bash\n";

  heap_overflow(add("cu_seqlens_2p21", "the final state [N,HV,K,V] [2097152,1048576,65536,16]: size overflows"));
  write_good_dump(add("hard_link_to_root", "/: reachable through 2 hard links"));
  patch_file(out.back().path, [](hid_t f) { H5Lcreate_hard(f, "/", f, "inputs/loop", H5P_DEFAULT, H5P_DEFAULT); });
  write_good_dump(add("hard_link_to_parent", "/inputs: reachable through 2 hard links"));
  patch_file(out.back().path, [](hid_t f) { H5Lcreate_hard(f, "inputs", f, "inputs/self", H5P_DEFAULT, H5P_DEFAULT); });
  write_good_dump(add("soft_link_loop", "/inputs/loop: a soft link (to '/inputs')"));
  patch_file(out.back().path, [](hid_t f) { H5Lcreate_soft("/inputs", f, "inputs/loop", H5P_DEFAULT, H5P_DEFAULT); });
  write_good_dump(add("external_link", "/inputs/q: an external link"));
  patch_file(out.back().path, [&](hid_t f) {
    H5Ldelete(f, "inputs/q", H5P_DEFAULT);
    H5Lcreate_external((dir + "/cu_seqlens_2p21.h5").c_str(), "/inputs/q", f, "inputs/q", H5P_DEFAULT, H5P_DEFAULT);
  });
  write_good_dump(add("external_storage", "/inputs/q: external raw storage"));
  patch_file(out.back().path, [&](hid_t f) {
    H5Ldelete(f, "inputs/q", H5P_DEFAULT);
    io::H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_external(dcpl.get(), passwd.c_str(), 0, 13 * 2 * 8 * 4);
    const hsize_t dims[4] = {1, 13, 2, 8};
    io::H5Id space(H5Screate_simple(4, dims, nullptr), H5Sclose);
    io::H5Id ds(H5Dcreate2(f, "inputs/q", H5T_NATIVE_FLOAT, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  });
  write_good_dump(add("declared_2gib_q", "/inputs/q: declares [1,65536,8,1024]"));
  patch_file(out.back().path, [](hid_t f) {
    io::H5Id in(H5Gopen2(f, "inputs", H5P_DEFAULT), H5Gclose);
    put(in.get(), "q", H5T_NATIVE_FLOAT, {1, 65536, 8, 1024}, nullptr, false);
  });
  from_good("scale_nan", "attribute scale: must be positive and finite, got nan", [](io::Dump& d) { d.attrs["scale"] = NAN; });
  from_good("chunk_size_7", "attribute chunk_size: expected a power of two", [](io::Dump& d) { d.attrs["chunk_size"] = int64_t(7); });
  from_good("chunk_size_2p62", "attribute chunk_size: expected a power of two",
            [](io::Dump& d) { d.attrs["chunk_size"] = int64_t(1) << 62; });
  from_good("empty_cu_seqlens", "/inputs/cu_seqlens: empty", [&](io::Dump& d) {
    input(d, "cu_seqlens").data = io::Array(DType::i64, {0});
  });
  from_good("bf16_label_not_bf16", "/inputs/q: labelled bfloat16", [&](io::Dump& d) {
    input(d, "q").source = DType::bf16;
    input(d, "q").data.view().set(5, 0.1);  // 0.1f is not a bfloat16 value
  });
  from_good("t_zero", "/inputs/q: shape [1,0,2,8] has no elements (T = 0 tokens)", [&](io::Dump& d) {
    auto& list = d.groups.at(0).datasets;
    std::erase_if(list, [](const io::DumpDataset& x) { return x.data.shape.size() < 3 || x.name == "initial_state"; });
    for (io::DumpDataset& ds : list) {
      Shape s = ds.data.shape;
      s[1] = 0;
      ds.data = io::Array(ds.data.dtype, s);
    }
  });
  from_good("q_is_group", "/inputs/q: a group, expected a dataset", [](io::Dump& d) {
    d.groups.at(0).datasets.erase(d.groups.at(0).datasets.begin());  // q is first
    d.add_group("inputs/q").add("x", io::Array(DType::f32, {1}), DType::f32);
  });
  write_good_dump(add("dtype_attr_integer", "/inputs/k: attribute dtype: expected a string"));
  patch_file(out.back().path, [&](hid_t f) {
    io::H5Id ds(H5Dopen2(f, "inputs/k", H5P_DEFAULT), H5Dclose);
    io::attrs_write(ds.get(), {{"dtype", int64_t(3)}}, "");
  });
  {  // kcp info used to print conv1d dumps without validating them
    io::Dump d;
    d.op = "conv1d";
    d.attrs = {{"op", std::string("conv1d")}, {"activation", std::string("swish")}, {"kernel_size", int64_t(4)}};
    io::DumpGroup& in = d.add_group("inputs");
    in.add("x", io::Array(DType::f32, {1, 10, 3}), DType::f32);
    in.add("weight", io::Array(DType::f32, {3, 4}), DType::f32);
    in.add("bias", io::Array(DType::f32, {5}), DType::f32);
    io::dump_write(add("conv1d_bias_shape", "/inputs/bias: expected shape [D] = [3], got [5]"), d);
  }
  return out;
}

}  // namespace kcp::test
