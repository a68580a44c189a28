// kcp: the command-line tool. `kcp help` lists the subcommands, `kcp <command> --help` (or
// `kcp help <command>`) one command's options and defaults (app/help.cpp), `kcp --version` the version.
#include <cstdio>
#include <cstring>
#include <exception>

#include "app/commands.h"
#include "app/help.h"

#ifndef KCP_VERSION
#define KCP_VERSION "unknown"
#endif
#ifdef KCP_HAS_IO
#include <string>

#include "app/isolate.h"
#include "io/limits.h"
#endif

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
  bool isolate = false;  // reads dumps: run in a child process
};

const Command kCommands[] = {
    {"bench-oracle", kcp::app::cmd_bench_oracle,
     "tokens/s of the CPU backends, forward and forward+backward (T=8192 H=4 K=V=128 by default)"},
#ifdef KCP_HAS_IO
    {"check", kcp::app::cmd_check,
     "[options] PATH...: run the oracle on dumps, judge every result (--json, --plot, --ratio, --rtol/--atol)"},
    {"compare", kcp::app::cmd_compare, "A.h5 B.h5: two dumps (kcp's bars) or any two HDF5 files (h5diff -d style)", true},
    {"run", kcp::app::cmd_run, "--backend NAME --in X.h5 --out Y.h5: add a backend's results to a dump", true},
    {"info", kcp::app::cmd_info, "FILE: what a dump holds", true},
    {"assemble", kcp::app::cmd_assemble, "--out G.h5 SHARD...: rebuild the global dump of a TP/CP run", true},
#endif
    {"bench", kcp::app::cmd_bench,
     "forward ms, GB/s, FLOP/s and roofline fraction of a device backend (default cuda-chunkwise)"},
#ifdef KCP_HAS_CP
    {"cp-sweep", kcp::app::cmd_cp_sweep,
     "context parallelism vs the single-process oracle over the layout matrix (run under mpirun -np N)"},
    {"cp-bench", kcp::app::cmd_cp_bench,
     "time of the CP phases per rank count (T=65536 H=4 K=V=128 by default; under mpirun)"},
#endif
};

void usage() {
  std::printf("usage: kcp [--max-memory SIZE] <command> [options]    (kcp <command> --help: its options; kcp "
              "--version)\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-14s %s\n", c.name, c.help);
}

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

int print_help(const char* command) {
  for (const Command& c : kCommands) {
    if (std::strcmp(command, c.name)) continue;
    const char* text = kcp::app::command_help(command);
    if (text) std::fputs(text, stdout);
    else std::printf("usage: kcp %s %s\n", c.name, c.help);
    return 0;
  }
  std::fprintf(stderr, "kcp: unknown command '%s'\n\n", command);
  usage();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef KCP_HAS_IO
  // kcp --max-memory SIZE <command> ...: the most a dump may make kcp allocate (io/limits.h)
  if (argc >= 3 && !std::strcmp(argv[1], "--max-memory")) {
    try {
      kcp::io::set_memory_limit(kcp::io::parse_bytes(argv[2], "--max-memory"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kcp: error: %s\n", e.what());
      return 2;
    }
    argv[2] = argv[0], argc -= 2, argv += 2;
  }
#endif
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    std::printf("kcp %s\n", KCP_VERSION);
    return 0;
  }
  if (argc >= 3 && !std::strcmp(argv[1], "help")) return print_help(argv[2]);
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (wants_help(argc, argv)) return print_help(argv[1]);
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name)) continue;
#ifdef KCP_HAS_IO
    // The commands that read dumps run in a child process (app/isolate.h); check isolates per file.
    if (c.isolate) {
      const kcp::app::Isolated r = kcp::app::run_isolated(
          "", std::string("kcp ") + c.name, [&](kcp::app::Tally&) { return c.run(argc - 2, argv + 2); });
      return r.status;
    }
#endif
    try {
      return c.run(argc - 2, argv + 2);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kcp %s: error: %s\n", c.name, e.what());
      return 2;
    }
  }
  std::fprintf(stderr, "kcp: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
