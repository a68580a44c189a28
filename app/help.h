// `kcp <command> --help`: the usage, options and defaults of every command, in one table, printed by
// kcp_main before the command runs (so MPI commands answer --help without MPI). Covered by
// tests/validation/test_cli.cpp (every command answers --help with exit status 0).
#pragma once

namespace kcp::app {

// nullptr for an unknown command.
const char* command_help(const char* command);

}  // namespace kcp::app
