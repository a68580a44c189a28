#!/usr/bin/env bash
# Forward+backward of cuda-chunkwise and of FLA in the same call on the GPU machine, one table with
# the ratio (issue 11's speed targets): kcp bench --backward 1, then scripts/bench_fla_backward.py.
#   scripts/bench_backward.sh KCP_BINARY     (logs to $OUT or .; FLA from FLA_PATH or /work/main/.fla carried)
set -uo pipefail
cd "$(dirname "$0")/.."
KCP=${1:-build-gpu/kcp}
LOG=${OUT:-.}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
"$KCP" bench --backward 1 --variant gdn --T 8192,32768 --H 16 --repeat 20 | tee "$LOG/kcp_bwd.txt"
"$KCP" bench --backward 1 --variant kda --T 8192 --H 16 --repeat 20 | tee -a "$LOG/kcp_bwd.txt"
python3 scripts/bench_fla_backward.py --kcp "$LOG/kcp_bwd.txt" | tee "$LOG/fla_bwd.txt"
