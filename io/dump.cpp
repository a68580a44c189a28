// dump_read / dump_write and the typed attribute getters (see dump.h).
#include "io/dump.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <set>

#include "core/error.h"
#include "io/limits.h"
#include "io/progress.h"

namespace kcp::io {
namespace {

// What one file may hold: nesting deeper than this, or more objects, is not a dump.
constexpr int kMaxDepth = 8;
constexpr size_t kMaxObjects = 10000;

struct ReadState {
  MemoryBudget budget;
  std::set<std::string> seen;  // objects visited, by file address: none may be reached twice
  size_t objects = 0;
};

void visit(ReadState& st, hid_t obj, const std::string& where) {
  const ObjectInfo o = object_info(obj, where);
  KCP_CHECK(st.seen.insert(o.key).second, where, ": reached a second time (a cycle or a shared object); a kcp "
            "dump holds each group and dataset once");
  KCP_CHECK(++st.objects <= kMaxObjects, where, ": more than ", kMaxObjects, " objects in the file (not a kcp dump)");
}

// Reads every dataset of group `name` (and of its subgroups, as separate DumpGroups).
void read_group(const Dump& d, ReadState& st, hid_t g, const std::string& name, int depth,
                std::vector<DumpGroup>& out) {
  const std::string where = d.path + ": /" + name;
  KCP_CHECK(depth <= kMaxDepth, where, ": groups nested deeper than ", kMaxDepth, " levels (not a kcp dump)");
  visit(st, g, where);
  const Members m = group_members(g, where);
  DumpGroup grp;
  grp.name = name;
  grp.attrs = attrs_read(g, where);
  for (const std::string& ds : m.datasets) {
    StoredArray s = dataset_read(g, ds, where + "/" + ds, &st.budget);
    grp.datasets.push_back({ds, std::move(s.data), s.source, s.encoding, std::move(s.attrs)});
  }
  out.push_back(std::move(grp));
  for (const std::string& sub : m.groups) {
    H5Id sg = group_open(g, sub, where + "/" + sub);
    read_group(d, st, sg.get(), name + "/" + sub, depth + 1, out);
  }
}

// A file name next to `target` that no other writer uses.
std::string temp_name(const std::string& target) {
  static std::atomic<int> counter{0};
  return target + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// Temporary files being written, for the SIGINT/SIGTERM handler: fixed slots of plain chars, since
// a signal handler may only unlink() what it finds (no allocation, no locks).
constexpr int kTempSlots = 16;
char g_temp_paths[kTempSlots][4096];
std::atomic<int> g_temp_used[kTempSlots];  // 0 free, 1 being filled, 2 holds a path
struct sigaction g_previous[2];

void remove_temps_and_reraise(int sig) {
  for (int i = 0; i < kTempSlots; ++i)
    if (g_temp_used[i].load() == 2) ::unlink(g_temp_paths[i]);
  sigaction(sig, &g_previous[sig == SIGINT ? 0 : 1], nullptr);  // then die as the signal would have
  ::raise(sig);
}

// Installs the handler unless it is already there (someone may have replaced it since: a test, a
// program's own handler, which is then called after the cleanup as the previous action).
void install_temp_cleanup() {
  const int sigs[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; ++i) {
    struct sigaction cur {};
    sigaction(sigs[i], nullptr, &cur);
    if (cur.sa_handler == remove_temps_and_reraise) continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temps_and_reraise;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, &g_previous[i]);
  }
}

// Removes the temporary file unless the write reached its rename; also on SIGINT/SIGTERM meanwhile.
struct TempFile {
  std::string path;
  bool committed = false;
  int slot = -1;
  explicit TempFile(std::string p) : path(std::move(p)) {
    install_temp_cleanup();
    for (int i = 0, free = 0; i < kTempSlots && path.size() < sizeof g_temp_paths[0]; ++i, free = 0)
      if (g_temp_used[i].compare_exchange_strong(free, 1)) {
        std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
        g_temp_used[i].store(2), slot = i;
        break;
      }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!committed) std::remove(path.c_str());
    if (slot >= 0) g_temp_used[slot].store(0);
  }
};

void write_contents(const std::string& tmp, const std::string& target, const Dump& d) {
  H5Id f = file_create(tmp);
  Attributes root = d.attrs;
  root["format"] = std::string(kDumpFormat);
  root["format_version"] = kDumpVersion;
  attrs_write(f.get(), root, target + ": /");
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  for (const DumpGroup& g : d.groups) {
    const std::string where = target + ": /" + g.name;
    H5Id grp(H5Gcreate2(f.get(), g.name.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (grp.get() < 0) h5_fail(where, "cannot create the group");
    attrs_write(grp.get(), g.attrs, where);
    for (const DumpDataset& ds : g.datasets)
      dataset_write(grp.get(), ds.name, ds.data, ds.source, ds.encoding, ds.attrs, where + "/" + ds.name);
  }
  if (H5Fflush(f.get(), H5F_SCOPE_GLOBAL) < 0) h5_fail(target, "cannot flush the file");
}

}  // namespace

const DumpDataset* DumpGroup::find(std::string_view n) const {
  for (const DumpDataset& d : datasets)
    if (d.name == n) return &d;
  return nullptr;
}

DumpDataset& DumpGroup::add(std::string n, Array data, DType source, Encoding encoding) {
  datasets.erase(std::remove_if(datasets.begin(), datasets.end(), [&](const DumpDataset& d) { return d.name == n; }),
                 datasets.end());
  datasets.push_back({std::move(n), std::move(data), source, encoding, {}});
  return datasets.back();
}

const DumpGroup* Dump::group(std::string_view n) const {
  for (const DumpGroup& g : groups)
    if (g.name == n) return &g;
  return nullptr;
}

const DumpGroup& Dump::inputs() const {
  const DumpGroup* g = group("inputs");
  KCP_CHECK(g, path, ": /inputs: missing (a layer capture, capture_point = layer: `kcp check` judges it with the "
            "layer oracle)");
  return *g;
}

DumpGroup& Dump::add_group(std::string n) {
  groups.erase(std::remove_if(groups.begin(), groups.end(), [&](const DumpGroup& g) { return g.name == n; }),
               groups.end());
  groups.push_back({});
  groups.back().name = std::move(n);
  return groups.back();
}

bool group_is_reserved(std::string_view n) {
  for (std::string_view r : {"inputs", "layer", "debug"})
    if (n == r || (n.size() > r.size() && n.substr(0, r.size()) == r && n[r.size()] == '/')) return true;
  return false;
}

std::vector<const DumpGroup*> Dump::result_groups() const {
  std::vector<const DumpGroup*> out;
  for (const DumpGroup& g : groups)
    if (!group_is_reserved(g.name) && g.name.find('/') == std::string::npos) out.push_back(&g);
  return out;
}

bool op_known(std::string_view op) { return op == "gdn" || op == "kda" || op == "gla" || op == "conv1d"; }

Dump dump_read(const std::string& path) {
  note_reading(path);
  H5Id f = file_open_read(path);
  Dump d;
  d.path = path;
  d.attrs = attrs_read(f.get(), path + ": /");
  const std::string root = path + ":";  // attribute messages read "x.h5: attribute op: ..."
  const std::string fmt = attr_string(d.attrs, "format", root, "");
  KCP_CHECK(fmt == kDumpFormat, path, ": not a kcp dump (root attribute format is ",
            fmt.empty() ? "missing" : "'" + fmt + "'", ", expected 'kcp-dump')");
  d.version = attr_int(d.attrs, "format_version", root, -1);
  KCP_CHECK(d.version == 1 || d.version == 2, path, ": attribute format_version: unknown format version ",
            d.version, " (this kcp reads versions 1 and 2)");
  d.op = attr_string(d.attrs, "op", root, "");
  KCP_CHECK(op_known(d.op), path, ": attribute op: unknown op '", d.op, "' (expected gdn, kda, gla or conv1d)");
  ReadState st;
  st.budget.file = path;
  H5Id root_group = group_open(f.get(), "/", path + ": /");
  check_linked_once(root_group.get(), path + ": /");
  visit(st, root_group.get(), path + ": /");
  const Members m = group_members(f.get(), path + ": /");
  for (const std::string& g : m.groups) {
    H5Id grp = group_open(f.get(), g, path + ": /" + g);
    read_group(d, st, grp.get(), g, 1, d.groups);
  }
  // A layer capture (capture_point = "layer") may hold only /layer: kcp judges it with the layer oracle.
  const bool layer_only = attr_string(d.attrs, "capture_point", root, "") == "layer" && d.group("layer");
  KCP_CHECK(d.group("inputs") || layer_only, path,
            ": /inputs: missing (every dump holds the operator's inputs there, or /layer with capture_point = layer)");
  note_done_reading();
  return d;
}

void dump_write(const std::string& path, const Dump& d) {
  TempFile tmp{temp_name(path)};
  write_contents(tmp.path, path, d);
  std::error_code ec;
  std::filesystem::rename(tmp.path, path, ec);
  KCP_CHECK(!ec, path, ": cannot move the finished file into place: ", ec.message());
  tmp.committed = true;
}

const AttrValue* attr_find(const Attributes& a, const std::string& key) {
  auto it = a.find(key);
  return it == a.end() ? nullptr : &it->second;
}

std::string attr_string(const Attributes& a, const std::string& key, const std::string& where,
                        const std::string& fallback) {
  const AttrValue* v = attr_find(a, key);
  if (!v) return fallback;
  const std::string* s = std::get_if<std::string>(v);
  KCP_CHECK(s, where, " attribute ", key, ": expected a string, got ", attr_describe(*v));
  return *s;
}

bool attr_flag(const Attributes& a, const std::string& key, const std::string& where, bool fallback) {
  const AttrValue* v = attr_find(a, key);
  if (!v) return fallback;
  if (const bool* b = std::get_if<bool>(v)) return *b;
  const int64_t* i = std::get_if<int64_t>(v);  // uint8 / int8 0 or 1
  KCP_CHECK(i && (*i == 0 || *i == 1), where, " attribute ", key,
            ": expected a boolean (h5py bool enum, or an integer 0/1), got ", attr_describe(*v));
  return *i == 1;
}

double attr_number(const Attributes& a, const std::string& key, const std::string& where, double fallback) {
  const AttrValue* v = attr_find(a, key);
  if (!v) return fallback;
  if (const double* d = std::get_if<double>(v)) return *d;
  const int64_t* i = std::get_if<int64_t>(v);
  KCP_CHECK(i, where, " attribute ", key, ": expected a number, got ", attr_describe(*v));
  return double(*i);
}

int64_t attr_int(const Attributes& a, const std::string& key, const std::string& where, int64_t fallback) {
  const AttrValue* v = attr_find(a, key);
  if (!v) return fallback;
  const int64_t* i = std::get_if<int64_t>(v);
  KCP_CHECK(i, where, " attribute ", key, ": expected an integer, got ", attr_describe(*v));
  return *i;
}

}  // namespace kcp::io
