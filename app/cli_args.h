// Minimal command-line parsing for the kcp subcommands: "--key value", "--flag", positionals.
// Unknown options are errors (a typo must not silently fall back to a default). Given the command's
// name, every option it accepts must be documented in its --help text (app/help.cpp): a help text
// that drifts from the parser fails the first run of the command (every command runs in the tests).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kcp::app {

class Args {
 public:
  // `options` take a value, `flags` do not.
  Args(int argc, char** argv, std::set<std::string> options, std::set<std::string> flags,
       const char* command = nullptr);
  bool has(const std::string& key) const { return values_.count(key) || flags_set_.count(key); }
  std::string get(const std::string& key, const std::string& fallback) const;
  long long get_int(const std::string& key, long long fallback) const;
  double get_double(const std::string& key, double fallback) const;
  // A 0|1 switch: unset when the option is absent; anything but 0 or 1 is an error naming it.
  std::optional<bool> get_switch(const std::string& key) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_set_;
  std::vector<std::string> positional_;
};

}  // namespace kcp::app
