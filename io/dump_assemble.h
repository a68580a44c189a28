// Rebuilds the global dump of a TP / CP run from its per-rank files (schema v2 placement,
// docs/DUMP_FORMAT.md section 5):
//   chunkwise CP: per-token tensors [B,T,...] concatenated along T in token_offset order; the
//                 global cu_seqlens (scope = "global", required when a shard has cu_seqlens_local,
//                 checked against it) taken from the shards; dA_log / ddt_bias /
//                 dweight / dbias, which each rank holds as its partial sum, added up.
//   headwise CP, TP: tensors with a head axis ([B,T,H|HV,...], [N,HV,...], A_log, dt_bias and
//                 their gradients) concatenated along it in head_offset order.
// Every group present in all shards is assembled; /layer and /debug are dropped. The result has
// cp_rank = -1 and no other placement, so `kcp check` judges it as a single-rank file.
// Covered by tests/io/test_assemble.cpp.
#pragma once

#include <vector>

#include "io/dump.h"

namespace kcp::io {

Dump dump_assemble(const std::vector<Dump>& shards);

}  // namespace kcp::io
