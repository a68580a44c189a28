// The kcp subcommands. Each takes the arguments after its name and returns the process exit code.
#pragma once

namespace kcp::app {

int cmd_bench_oracle(int argc, char** argv);
int cmd_check(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_assemble(int argc, char** argv);
int cmd_cp_sweep(int argc, char** argv);  // app/cp_sweep.cpp (built with MPI)
int cmd_cp_bench(int argc, char** argv);  // app/cp_bench.cpp (built with MPI)
int cmd_bench(int argc, char** argv);

}  // namespace kcp::app
