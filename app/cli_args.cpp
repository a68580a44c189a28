// Args: see cli_args.h.
#include "app/cli_args.h"

#include <cstdlib>

#include "app/help.h"
#include "core/error.h"

namespace kcp::app {

Args::Args(int argc, char** argv, std::set<std::string> options, std::set<std::string> flags, const char* command) {
  if (const char* help = command ? command_help(command) : nullptr) {
    const std::string text = help;
    for (const auto* names : {&options, &flags})
      for (const std::string& o : *names)
        KCP_CHECK(text.find("--" + o) != std::string::npos, "kcp ", command, ": option --", o,
                  " is missing from its --help text (app/help.cpp)");
  }
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1), key = key.substr(0, eq);
      KCP_CHECK(options.count(key), "unknown option --", key);
      values_[key] = value;
    } else if (flags.count(key)) {
      flags_set_.insert(key);
    } else {
      KCP_CHECK(options.count(key), "unknown option --", key);
      KCP_CHECK(i + 1 < argc, "option --", key, " needs a value");
      values_[key] = argv[++i];
    }
  }
}

std::string Args::get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

long long Args::get_int(const std::string& key, long long fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  KCP_CHECK(end && *end == 0 && !it->second.empty(), "--", key, ": expected an integer, got '", it->second, "'");
  return v;
}

std::optional<bool> Args::get_switch(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  KCP_CHECK(it->second == "0" || it->second == "1", "--", key, ": expected 0 or 1, got '", it->second, "'");
  return it->second == "1";
}

double Args::get_double(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  KCP_CHECK(end && *end == 0 && !it->second.empty(), "--", key, ": expected a number, got '", it->second, "'");
  return v;
}

}  // namespace kcp::app
