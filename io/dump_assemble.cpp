// dump_assemble: per-rank dumps -> the global dump (see dump_assemble.h).
#include "io/dump_assemble.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "io/dump_call.h"

namespace kcp::io {
namespace {

enum class Join { concat, sum, same, drop };
struct Rule {
  Join join;
  int axis;  // for concat
};

bool one_of(std::string_view x, std::initializer_list<std::string_view> s) {
  return std::find(s.begin(), s.end(), x) != s.end();
}

// How dataset `name` of `op` joins when shards split tokens (chunkwise) or heads.
Rule rule_for(std::string_view op, std::string_view name, bool tokens) {
  if (name == "cu_seqlens_local") return {Join::drop, 0};
  if (name == "cu_seqlens") return {Join::same, 0};  // chunkwise: the global one, checked by the caller
  if (op == "conv1d") {
    KCP_CHECK(tokens, "conv1d dumps assemble from chunkwise (token) shards only");
    if (one_of(name, {"x", "dy", "y", "dx"})) return {Join::concat, 1};
    if (one_of(name, {"weight", "bias"})) return {Join::same, 0};
    if (one_of(name, {"dweight", "dbias"})) return {Join::sum, 0};
  } else {
    if (one_of(name, {"q", "k", "v", "g", "beta", "do", "o", "dq", "dk", "dv", "dg", "dbeta"}))
      return {Join::concat, tokens ? 1 : 2};
    if (one_of(name, {"initial_state", "dht", "final_state", "dinitial_state"})) {
      KCP_CHECK(!tokens, name, ": chunkwise CP shards cannot hold states (FLA forbids them there)");
      return {Join::concat, 1};
    }
    if (one_of(name, {"A_log", "dt_bias"})) return {tokens ? Join::same : Join::concat, 0};
    if (one_of(name, {"dA_log", "ddt_bias"})) return {tokens ? Join::sum : Join::concat, 0};
  }
  throw Error(detail::concat(name, ": kcp does not know how this dataset splits across ranks"));
}

Array concat(const std::vector<const Array*>& parts, int axis, const std::string& what) {
  Shape s = parts[0]->shape;
  KCP_CHECK(axis < int(s.size()), what, ": rank ", s.size(), " has no axis ", axis);
  int64_t total = 0;
  for (const Array* p : parts) {
    Shape a = p->shape, b = s;
    KCP_CHECK(a.size() == b.size() && p->dtype == parts[0]->dtype, what, ": shards differ in rank or dtype");
    a[size_t(axis)] = b[size_t(axis)] = 0;
    KCP_CHECK(a == b, what, ": shards ", shape_str(p->shape), " and ", shape_str(s), " differ off axis ", axis);
    total += p->shape[size_t(axis)];
  }
  s[size_t(axis)] = total;
  Array out(parts[0]->dtype, s);
  int64_t outer = 1, inner = dtype_size(out.dtype);
  for (int d = 0; d < axis; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(axis) + 1; d < s.size(); ++d) inner *= s[d];
  auto* dst = static_cast<char*>(out.data());
  for (int64_t o = 0; o < outer; ++o)
    for (const Array* p : parts) {
      const size_t n = size_t(p->shape[size_t(axis)] * inner);
      std::memcpy(dst, static_cast<const char*>(p->data()) + size_t(o) * n, n);
      dst += n;
    }
  return out;
}

Array sum(const std::vector<const Array*>& parts, const std::string& what) {
  Tensor<double> acc = to_tensor<double>(parts[0]->view());
  for (size_t i = 1; i < parts.size(); ++i) {
    KCP_CHECK(parts[i]->shape == parts[0]->shape, what, ": partial sums of different shapes");
    const Tensor<double> x = to_tensor<double>(parts[i]->view());
    for (int64_t j = 0; j < acc.numel(); ++j) acc.data()[j] += x.data()[j];
  }
  Array out(parts[0]->dtype, parts[0]->shape);
  view_store<double>(out.view(), 0, acc.numel(), 1, acc.data());
  return out;
}

Array same(const std::vector<const Array*>& parts, const std::string& what) {
  for (const Array* p : parts)
    KCP_CHECK(p->shape == parts[0]->shape && p->dtype == parts[0]->dtype &&
                  std::memcmp(p->data(), parts[0]->data(), p->nbytes()) == 0,
              what, ": must be identical on every rank, but differs");
  return *parts[0];
}

DumpGroup join_group(const std::vector<const Dump*>& shards, const std::string& group, bool tokens) {
  DumpGroup out;
  out.name = group;
  out.attrs = shards[0]->group(group)->attrs;
  for (const DumpDataset& first : shards[0]->group(group)->datasets) {
    const std::string what = "/" + group + "/" + first.name;
    const Rule r = rule_for(shards[0]->op, first.name, tokens);
    if (r.join == Join::drop) continue;
    std::vector<const Array*> parts;
    for (const Dump* s : shards) {
      const DumpGroup* g = s->group(group);
      const DumpDataset* ds = g ? g->find(first.name) : nullptr;
      KCP_CHECK(ds, s->path, ": ", what, ": missing on this rank");
      parts.push_back(&ds->data);
    }
    DumpDataset& d = out.add(first.name, {}, first.source, first.encoding);
    d.attrs = first.attrs;
    d.data = r.join == Join::concat ? concat(parts, r.axis, what) : r.join == Join::sum ? sum(parts, what)
                                                                                         : same(parts, what);
  }
  return out;
}

// Chunkwise shards must carry the global cu_seqlens (scope "global"), ending at the shards' total T and
// agreeing with each shard's cu_seqlens_local; without it the assembled file would silently hold one
// sequence. `shards` in token_offset order; `total` their token count.
void check_global_cu(const std::vector<const Dump*>& shards, int64_t total) {
  for (const Dump* s : shards) {
    const DumpGroup& in = s->inputs();
    const DumpDataset* cu = in.find("cu_seqlens");
    const DumpDataset* loc = in.find("cu_seqlens_local");
    const std::string where = s->path + ": /inputs/cu_seqlens";
    if (!cu) {
      KCP_CHECK(!loc, where, ": missing; a chunkwise shard with cu_seqlens_local needs the global cu_seqlens "
                "(scope = \"global\") to be assembled (kcp_dump: KernelCapture(..., cp_global_cu_seqlens=cu))");
      continue;
    }
    const std::string scope = attr_string(cu->attrs, "scope", where, "local");
    KCP_CHECK(scope == "global", where, ": scope '", scope, "'; a chunkwise shard must store the global "
              "cu_seqlens (attribute scope = \"global\"), the rank-local one as cu_seqlens_local");
    const std::vector<int64_t> g = to_tensor<int64_t>(cu->data.view()).vec();
    KCP_CHECK(g.size() >= 2 && g.front() == 0 && g.back() == total, where, ": the global cu_seqlens runs from ",
              g.empty() ? -1 : g.front(), " to ", g.empty() ? -1 : g.back(), ", but the shards hold tokens [0, ",
              total, ")");
    if (!loc) continue;
    const int64_t lo = dump_placement(*s).token_offset, T_local = in.find(s->op == "conv1d" ? "x" : "q")->data.shape[1];
    const std::vector<int64_t> want = local_cu_seqlens(g, lo, lo + T_local), got = to_tensor<int64_t>(loc->data.view()).vec();
    KCP_CHECK(want == got, s->path, ": /inputs/cu_seqlens_local ", shape_str(Shape(got)), " is not the global cu_seqlens "
              "cut to this rank's tokens [", lo, ", ", lo + T_local, "), which gives ", shape_str(Shape(want)));
  }
}

// Joins shards along tokens or heads, in offset order, checking the offsets tile the whole.
Dump join(std::vector<const Dump*> shards, bool tokens) {
  const char* key = tokens ? "token_offset" : "head_offset";
  auto offset = [&](const Dump* d) { return attr_int(d->attrs, key, d->path + ":", 0); };
  std::sort(shards.begin(), shards.end(), [&](const Dump* a, const Dump* b) { return offset(a) < offset(b); });
  const char* probe = shards[0]->op == "conv1d" ? "x" : (tokens ? "q" : "v");
  for (size_t i = 0, expect = 0; i < shards.size(); ++i) {
    const DumpDataset* p = shards[i]->inputs().find(probe);
    KCP_CHECK(p && p->data.shape.size() >= 3, shards[i]->path, ": /inputs/", probe, ": missing or not [B,T,...]");
    KCP_CHECK(offset(shards[i]) == int64_t(expect), shards[i]->path, ": attribute ", key, " = ", offset(shards[i]),
              ", but the shards before it end at ", expect, " (a rank is missing or repeated)");
    expect += size_t(p->data.shape[tokens ? 1 : 2]);
    if (tokens && i + 1 == shards.size()) check_global_cu(shards, int64_t(expect));
  }
  Dump out = *shards[0];
  out.groups.clear();
  for (const DumpGroup& g : shards[0]->groups) {
    if (group_is_reserved(g.name) && g.name != "inputs") continue;  // layer/debug: no generic rule
    if (std::all_of(shards.begin(), shards.end(), [&](const Dump* s) { return s->group(g.name) != nullptr; }))
      out.groups.push_back(join_group(shards, g.name, tokens));
  }
  return out;
}

}  // namespace

Dump dump_assemble(const std::vector<Dump>& shards) {
  KCP_CHECK(!shards.empty(), "assemble: no shards given");
  const Placement p0 = dump_placement(shards[0]);
  std::map<int64_t, std::vector<const Dump*>> by_tp;  // tp_rank -> its CP shards
  for (const Dump& d : shards) {
    const Placement p = dump_placement(d);
    KCP_CHECK(d.op == shards[0].op && p.cp_mode == p0.cp_mode && p.cp_size == p0.cp_size && p.tp_size == p0.tp_size,
              d.path, ": op / cp_mode / cp_size / tp_size differ from ", shards[0].path);
    by_tp[p.tp_rank].push_back(&d);
  }
  KCP_CHECK(int64_t(shards.size()) == p0.tp_size * p0.cp_size, "assemble: expected tp_size * cp_size = ",
            p0.tp_size * p0.cp_size, " shards, got ", shards.size());
  Dump out;
  if (p0.cp_mode == "chunkwise") {
    std::vector<Dump> per_tp;
    for (auto& [tp, list] : by_tp) per_tp.push_back(join(list, true));
    std::vector<const Dump*> ptrs;
    for (const Dump& d : per_tp) ptrs.push_back(&d);
    out = ptrs.size() == 1 ? per_tp[0] : join(ptrs, false);
  } else {
    std::vector<const Dump*> all;
    for (const Dump& d : shards) all.push_back(&d);
    out = join(all, false);
  }
  for (const char* k : {"tp_size", "tp_rank", "cp_size", "cp_mode", "cp_partition", "head_offset", "token_offset",
                        "cp_pre_num_ranks", "cp_post_num_ranks", "cp_is_first_rank", "cp_is_last_rank",
                        "cp_pre_num_conv_tokens", "global_rank", "B", "T", "H", "HV", "K", "V", "N"})
    out.attrs.erase(k);
  out.attrs["cp_rank"] = int64_t(-1);
  out.attrs["assembled_from"] = int64_t(shards.size());
  out.attrs["assembled_cp_mode"] = p0.cp_mode;
  out.attrs["assembled_cp_size"] = p0.cp_size;
  out.attrs["assembled_tp_size"] = p0.tp_size;
  if (p0.cp_mode == "chunkwise") {  // where each CP rank's tokens start: kcp check --plot marks them
    std::vector<int64_t> starts;
    for (const Dump* d : by_tp.begin()->second) starts.push_back(dump_placement(*d).token_offset);
    std::sort(starts.begin(), starts.end());
    std::string s;
    for (int64_t v : starts) {
      if (!s.empty()) s += ',';
      s += std::to_string(v);
    }
    out.attrs["assembled_token_offsets"] = s;
  }
  out.path = shards[0].path + " (assembled)";
  return out;
}

}  // namespace kcp::io
