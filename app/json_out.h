// A small JSON writer (no dependency, so `kcp check --json` exists in every build, the GPU machine's
// included) and the record `kcp check --json FILE` writes: every file with its description or error,
// every row of the table with its measures, bar and verdict, the totals and the exit status.
// Non-finite numbers are written as null (JSON has no NaN). Covered by tests/validation/test_cli.cpp.
#pragma once

#include <string>
#include <vector>

#include "app/report.h"

namespace kcp::app {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& k);
  JsonWriter& value(const std::string& s);
  JsonWriter& value(const char* s) { return value(std::string(s)); }
  JsonWriter& value(double x);
  JsonWriter& value(int64_t x);
  JsonWriter& value(int x) { return value(static_cast<int64_t>(x)); }
  JsonWriter& value(bool b);
  JsonWriter& raw(const std::string& json);  // a value already written by another JsonWriter
  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

struct CheckedFile {
  std::string path, description, input_dtype, placement, error;
  Tally tally;
};

// One file's record (an object), written where the file was checked (in kcp check's child process).
std::string checked_file_json(const CheckedFile& f);
// Writes the record of the run atomically (temp file + rename); `files` are checked_file_json's.
void write_check_json(const std::string& path, const std::vector<std::string>& files, const Tally& total,
                      const UserBar& user, int exit_status);

}  // namespace kcp::app
