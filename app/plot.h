// kcp check --plot DIR: one PNG per failing, warning or --select'ed tensor, DIR/<file>__<group>__<tensor>.png.
// Top panel, the error along the sequence: for every token (x, batch rows side by side) and head (one
// coloured line each), e = rms over the token's elements of (candidate - oracle) / rms(oracle), the
// per-token share of FLA's ratio, on a log axis; the ratio bar as a red dashed line; sequence
// boundaries (cu_seqlens, batch rows) as grey dashed lines, CP-rank boundaries (assembled chunkwise
// files: assembled_token_offsets) as orange ones; on a failing tensor, the first token over both the bar and 10x the median token
// error (or not finite) marked: where an error starts. With more
// tokens than pixels each column shows the largest error of its tokens. Tensors without a token axis
// (states, A_log) get the histogram only.
// Bottom panel, a histogram of element errors against the bar: log10(|d| / rms(oracle)) for a ratio
// bar (the bar at log10(ratio)), log10(|d| / (atol + rtol |oracle|)) for --rtol/--atol (the bar at 0);
// bins over the bar in red. Covered by tests/validation/test_cli.cpp.
#pragma once

#include <string>

#include "app/report.h"
#include "io/dump.h"

namespace kcp::app {

// Returns the file written.
std::string plot_tensor(const std::string& dir, const io::Dump& d, const std::string& group,
                        const std::string& tensor, const TensorView& candidate, const TensorView& oracle,
                        const Row& row, const UserBar& user);

}  // namespace kcp::app
