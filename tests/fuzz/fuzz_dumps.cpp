// kcp_fuzz: a mutation fuzzer for the dump reader, through the same code path as `kcp check`
// (app::cmd_check: the reader in an isolated child per file, the oracle, the report).
//   kcp_fuzz --seconds S [--seed N] [--mem-mb M] [--timeout-s T] [--keep DIR] [--replay FILE...]
// Seeds: data/golden/*.h5, the hostile kinds (tests/io/hostile_files.h) and a small good dump.
// Each input is 1-4 mutations of a seed (bit flips, interesting bytes, boundary integers over 2/4/8
// bytes, truncation, a copied block). Each runs in a forked child under setrlimit(RLIMIT_AS) (not
// under ASan, which reserves terabytes of address space) and a wall-clock limit; the child's exit
// status must be 0, 1, 2 or 3 (kcp check: nothing judged). A signal, a hang (killed at the limit), a sanitizer report (ASan/UBSan
// exit with a signal or status 23/1 from the runtime: we set exitcode=23) or a peak RSS over
// --mem-mb is a finding: the input is kept under --keep and the run fails. Crashes of the HDF5
// library that the isolation contained ("corrupt HDF5 file (SIG...") are counted and the first few
// kept too, as regression inputs for tests/fuzz/regressions.
// Prints: inputs tried, exit 0/1/2/3 counts, contained reader crashes, findings, peak RSS.
// Run by ctest (fuzz_smoke, about 2 minutes) and scripts/fuzz.sh MINUTES.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "app/commands.h"
#include "tests/io/hostile_files.h"

namespace fs = std::filesystem;

namespace {

struct Options {
  double seconds = 60;
  uint64_t seed = 1;
  long mem_mb = 2048;
  double timeout_s = 20;
  std::string keep = "fuzz-findings";
  std::vector<std::string> replay;
};

bool under_asan() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
}

std::string mutate(std::string b, std::mt19937_64& rng) {
  const int ops = 1 + int(rng() % 4);
  for (int i = 0; i < ops && !b.empty(); ++i) {
    const size_t at = rng() % b.size();
    switch (rng() % 6) {
      case 0: case 1: b[at] = char(b[at] ^ (1 << (rng() % 8))); break;  // bit flip
      case 2: {
        const unsigned char v[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe};
        b[at] = char(v[rng() % sizeof v]);
        break;
      }
      case 3: {  // a boundary integer over 2, 4 or 8 bytes
        const uint64_t v[] = {0, 1, ~0ull, 0x7fffffffull, 0x80000000ull, 0xffffffffull, 1ull << 62, 65535, 65536,
                              (1ull << 21) + 1};
        const uint64_t x = v[rng() % (sizeof v / sizeof v[0])];
        const size_t w = size_t(2) << (rng() % 3);
        if (at + w <= b.size()) std::memcpy(&b[at], &x, w);
        break;
      }
      case 4: if (rng() % 4 == 0) b.resize(at); break;  // truncation (rarer: it is the dullest)
      case 5: {  // copy a block over another place
        const size_t from = rng() % b.size(), n = std::min<size_t>(1 + rng() % 64, b.size() - std::max(from, at));
        std::memmove(&b[at], &b[from], n);
        break;
      }
    }
  }
  return b;
}

struct Outcome {
  int exit_code = -1;  // 0, 1, 2, 3 (nothing judged); -1 when signalled or killed
  int signal = 0;
  bool hang = false;
  bool contained = false;  // the isolation reported a reader crash
  long rss_kb = 0;
};

// `kcp check FILE` (cpu-recurrent, float64) in a child: the program's code path, isolation included.
Outcome run_one(const std::string& file, const Options& o, const std::string& err_file) {
  Outcome out;
  const pid_t pid = fork();
  if (pid == 0) {
    if (!under_asan()) {
      const rlim_t bytes = rlim_t(o.mem_mb) * 1024 * 1024 * 2;  // address space: twice the RSS bound
      rlimit r{bytes, bytes};
      setrlimit(RLIMIT_AS, &r);
    }
    const int fd = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1), dup2(fd, 2);
    std::string f = file;
    char* argv[] = {f.data(), nullptr};
    _exit(kcp::app::cmd_check(1, argv));
  }
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  rusage ru{};
  for (;;) {
    const pid_t w = wait4(pid, &status, WNOHANG, &ru);
    if (w == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > o.timeout_s) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &ru);
      out.hang = true;
      break;
    }
    usleep(2000);
  }
  out.rss_kb = ru.ru_maxrss;
  if (WIFSIGNALED(status) && !out.hang) out.signal = WTERMSIG(status);
  if (WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  out.contained = read_bytes(err_file).find("corrupt HDF5 file (SIG") != std::string::npos;
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seconds") o.seconds = std::atof(next().c_str());
    else if (a == "--seed") o.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--mem-mb") o.mem_mb = std::atol(next().c_str());
    else if (a == "--timeout-s") o.timeout_s = std::atof(next().c_str());
    else if (a == "--keep") o.keep = next();
    else if (a == "--replay") while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) o.replay.push_back(argv[++i]);
    else { std::fprintf(stderr, "kcp_fuzz: unknown argument %s\n", a.c_str()); std::exit(2); }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  setenv("KCP_MAX_MEMORY", (std::to_string(o.mem_mb / 2) + "M").c_str(), 0);  // the reader's own budget
  setenv("KCP_READ_TIMEOUT", std::to_string(int(o.timeout_s / 2) + 1).c_str(), 0);
  setenv("OMP_NUM_THREADS", "1", 0);
  const fs::path work = fs::current_path() / ("fuzz_work_" + std::to_string(getpid()));
  fs::create_directories(work);
  fs::create_directories(o.keep);
  const std::string err_file = (work / "stderr.txt").string();
  int findings = 0;
  auto judge = [&](const std::string& input, const Outcome& r, const std::string& name) {
    const bool bad = r.signal || r.hang || r.rss_kb > o.mem_mb * 1024 || (r.exit_code < 0 || r.exit_code > 3);
    if (!bad) return;
    ++findings;
    const std::string kept = (fs::path(o.keep) / (name + ".h5")).string();
    fs::copy_file(input, kept, fs::copy_options::overwrite_existing);
    std::printf("FINDING %s: %s (exit %d, signal %d, peak %ld MiB)\n%s", kept.c_str(),
                r.hang ? "hang" : r.signal ? "signal" : r.rss_kb > o.mem_mb * 1024 ? "memory over the bound" : "bad exit",
                r.exit_code, r.signal, r.rss_kb / 1024, read_bytes(err_file).c_str());
  };
  if (!o.replay.empty()) {  // regression inputs: each must end 0/1/2, bounded
    for (const std::string& f : o.replay) {
      const Outcome r = run_one(f, o, err_file);
      if (r.contained) std::printf("%s: contained: %s", f.c_str(), read_bytes(err_file).c_str());
      judge(f, r, fs::path(f).stem().string() + "-replay");
    }
    std::printf("kcp_fuzz: replayed %zu input(s), %d finding(s)\n", o.replay.size(), findings);
    fs::remove_all(work);
    return findings ? 1 : 0;
  }
  std::vector<std::string> seeds;
  const char* src = std::getenv("KCP_SOURCE_DIR");
  if (src)
    for (const auto& e : fs::directory_iterator(fs::path(src) / "data" / "golden"))
      if (e.path().extension() == ".h5") seeds.push_back(read_bytes(e.path().string()));
  const fs::path hostile = work / "hostile";
  fs::create_directories(hostile);
  // Written by a child: this process must not initialise libhdf5 itself, or every forked input
  // would start from its state (kcp's own children start with a pristine library).
  if (const pid_t maker = fork(); maker == 0) {
    kcp::test::make_hostile_files(hostile.string());
    kcp::test::write_good_dump((hostile / "good.h5").string());
    _exit(0);
  } else {
    waitpid(maker, nullptr, 0);
  }
  for (const auto& e : fs::directory_iterator(hostile))
    if (e.path().extension() == ".h5" && fs::file_size(e.path()) < (4 << 20)) seeds.push_back(read_bytes(e.path().string()));
  std::printf("kcp_fuzz: seed %llu, %zu seeds, %.0f s, memory bound %ld MiB, %.0f s per input%s\n",
              static_cast<unsigned long long>(o.seed), seeds.size(), o.seconds, o.mem_mb, o.timeout_s,
              under_asan() ? ", AddressSanitizer build (no RLIMIT_AS)" : "");
  std::fflush(stdout);
  std::mt19937_64 rng(o.seed);
  const std::string input = (work / "input.h5").string();
  long tried = 0, exits[4] = {0, 0, 0, 0}, contained = 0, kept_contained = 0, peak_kb = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < o.seconds) {
    write_bytes(input, mutate(seeds[rng() % seeds.size()], rng));
    const Outcome r = run_one(input, o, err_file);
    ++tried;
    if (r.exit_code >= 0 && r.exit_code <= 3) ++exits[r.exit_code];
    peak_kb = std::max(peak_kb, r.rss_kb);
    if (r.contained) {
      ++contained;
      if (kept_contained++ < 5)
        fs::copy_file(input, fs::path(o.keep) / ("contained-" + std::to_string(o.seed) + "-" + std::to_string(tried) + ".h5"),
                      fs::copy_options::overwrite_existing);
    }
    judge(input, r, "finding-" + std::to_string(o.seed) + "-" + std::to_string(tried));
  }
  rusage all{};
  getrusage(RUSAGE_CHILDREN, &all);
  std::printf("kcp_fuzz: %ld inputs in %.0f s: exit 0: %ld, exit 1: %ld, exit 2: %ld, exit 3: %ld; reader crashes contained by "
              "the isolation: %ld; findings (signal, hang, sanitizer, memory): %d; peak RSS %ld MiB (children, "
              "grandchildren included: %ld MiB)\n",
              tried, o.seconds, exits[0], exits[1], exits[2], exits[3], contained, findings, peak_kb / 1024, all.ru_maxrss / 1024);
  fs::remove_all(work);
  return findings ? 1 : 0;
}
