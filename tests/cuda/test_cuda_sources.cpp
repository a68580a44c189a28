// A source rule for cuda/ that the compiler does not enforce: no "if constexpr (...)" without braces
// directly followed by a "#pragma" line. nvcc 13 took the statements after such an
// `if constexpr (c) #pragma unroll for (...)` into the if: in the ninth session kernel hv's whole kda / gla
// epilogue left the PTX that way, silently (test_cuda caught it on the GPU; this catches it on CI).
// Runs without a GPU (label cuda, test_cuda_backend).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

// file:line of every unbraced `if constexpr (...)` whose next line starts with #pragma.
std::vector<std::string> unbraced_if_pragma(const std::filesystem::path& file) {
  static const std::regex kIf(R"(^\s*(\}\s*else\s+)?if\s+constexpr\s*\(.*\)\s*(//.*)?$)");
  static const std::regex kPragma(R"(^\s*#\s*pragma\b)");
  std::ifstream in(file);
  std::vector<std::string> hits;
  std::string prev, line;
  for (int n = 1; std::getline(in, line); ++n, prev = line)
    if (std::regex_search(line, kPragma) && std::regex_search(prev, kIf))
      hits.push_back(file.filename().string() + ":" + std::to_string(n - 1));
  return hits;
}

}  // namespace

TEST_CASE("cuda sources: no unbraced if constexpr directly before a #pragma") {
  const char* src = std::getenv("KCP_SOURCE_DIR");
  const std::filesystem::path dir = std::filesystem::path(src ? src : ".") / "cuda";
  REQUIRE(std::filesystem::is_directory(dir));
  int files = 0;
  std::vector<std::string> hits;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    ++files;
    for (const std::string& h : unbraced_if_pragma(e.path())) hits.push_back(h);
  }
  CHECK(files > 20);  // the folder was found and read
  for (const std::string& h : hits) FAIL_CHECK("unbraced if constexpr before #pragma at " << h);
}

TEST_CASE("cuda sources: the rule finds the pattern it forbids") {
  const std::filesystem::path f = std::filesystem::temp_directory_path() / "kcp_if_pragma_probe.cu";
  {
    std::ofstream out(f);
    out << "void g() {\n  if constexpr (kX)  // note\n#pragma unroll\n    for (int i = 0; i < 4; ++i) {}\n"
           "  if constexpr (kY) {\n#pragma unroll\n    for (int i = 0; i < 4; ++i) {}\n  }\n}\n";
  }
  const std::vector<std::string> hits = unbraced_if_pragma(f);
  std::filesystem::remove(f);
  REQUIRE(hits.size() == 1);
  CHECK(hits[0] == "kcp_if_pragma_probe.cu:2");
}
