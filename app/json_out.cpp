// JsonWriter and write_check_json: see json_out.h.
#include "app/json_out.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "validation/compare.h"

namespace kcp::app {

void JsonWriter::separate() {
  if (after_key_) { after_key_ = false; return; }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::begin_object() { separate(); out_ += "{"; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::end_object() { first_.pop_back(); out_ += "}"; return *this; }
JsonWriter& JsonWriter::begin_array() { separate(); out_ += "["; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::end_array() { first_.pop_back(); out_ += "]"; return *this; }

JsonWriter& JsonWriter::key(const std::string& k) {
  value(k);
  out_ += ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(const std::string& s) {
  separate();
  out_ += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out_ += '\\', out_ += char(c);
    else if (c == '\n') out_ += "\\n";
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out_ += b; }
    else out_ += char(c);
  }
  out_ += '"';
  return *this;
}

JsonWriter& JsonWriter::value(double x) {
  separate();
  if (!std::isfinite(x)) { out_ += "null"; return *this; }
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", x);
  out_ += b;
  return *this;
}

JsonWriter& JsonWriter::value(int64_t x) { separate(); out_ += std::to_string(x); return *this; }
JsonWriter& JsonWriter::value(bool b) { separate(); out_ += b ? "true" : "false"; return *this; }
JsonWriter& JsonWriter::raw(const std::string& json) { separate(); out_ += json; return *this; }

namespace {

void write_tally(JsonWriter& j, const Tally& t) {
  j.key("pass").value(t.pass).key("warn").value(t.warn).key("fail").value(t.fail).key("skip").value(t.skip);
}

void write_row(JsonWriter& j, const Row& r) {
  j.begin_object().key("group").value(r.group).key("tensor").value(r.tensor).key("verdict").value(r.verdict);
  if (!r.note.empty()) j.key("reason").value(r.note);
  if (r.measured) {
    const val::Metrics& m = r.m;
    j.key("dtype").value(r.dtype).key("n").value(m.n).key("max_abs").value(m.max_abs);
    j.key("max_abs_at").begin_array();
    for (int64_t i : m.max_abs_at) j.value(i);
    j.end_array();
    j.key("fla_ratio").value(m.fla_ratio).key("rel_l2").value(m.rel_l2).key("cosine").value(m.cosine);
    j.key("max_bf16_ulp").value(m.max_bf16_ulp).key("rounded_to_bf16").value(m.rounded_to_bf16()).key("nan").value(m.nan_a).key("inf").value(m.inf_a);
    j.key("over_the_bar").value(r.over);
    if (r.ratio_bar > 0) j.key("ratio_bar").value(r.ratio_bar);
    j.key("bar_reason").value(r.bar_reason);
  }
  j.end_object();
}

}  // namespace

std::string checked_file_json(const CheckedFile& f) {
  JsonWriter j;
  j.begin_object().key("path").value(f.path);
  if (!f.error.empty()) j.key("error").value(f.error);
  else {
    j.key("problem").value(f.description).key("input_dtype").value(f.input_dtype).key("placement").value(f.placement);
    write_tally(j, f.tally);
    j.key("tensors").begin_array();
    for (const Row& r : f.tally.rows) write_row(j, r);
    j.end_array();
  }
  j.end_object();
  return j.str();
}

void write_check_json(const std::string& path, const std::vector<std::string>& files, const Tally& total,
                      const UserBar& user, int exit_status) {
  JsonWriter j;
  j.begin_object().key("tool").value("kcp check").key("format").value(1);
  j.key("user_bar").value(user.any() ? user.describe() : std::string("policy (docs/GOLDEN.md)"));
  j.key("files").begin_array();
  for (const std::string& f : files) j.raw(f);
  j.end_array();
  j.key("total").begin_object();
  write_tally(j, total);
  j.end_object().key("exit_status").value(exit_status).end_object();
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream os(tmp);
    KCP_CHECK(os.good(), "--json ", path, ": cannot write");
    os << j.str() << "\n";
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KCP_CHECK(!ec, "--json ", path, ": cannot rename the temporary file: ", ec.message());
}

}  // namespace kcp::app
