#!/usr/bin/env bash
# The backward's GPU check (issue 11): the backward test cases of test_cuda (oracle sweep, stages
# against the CPU twin, transition_backward), forward+backward times with the per-stage split
# (KCP_CUDA_STAGE_TIMES=1), and racecheck on the stage test. About 30 s on an H100.
#   scripts/gpu_bwd_check.sh [DIR]    DIR holds test_cuda and kcp (default build/, as built there);
#                                     logs go to $OUT when set, else gpu-logs/
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
TEST=$DIR/tests/cuda/test_cuda
[ -x "$TEST" ] || TEST=$DIR/test_cuda
KCP=$DIR/kcp
"$TEST" -tc='*backward*' > "$LOGS/bwd_tests.log" 2>&1
echo "backward tests: rc=$?"
grep -E "test cases:|assertions:" "$LOGS/bwd_tests.log"
BENCH=(bench --backend cuda-chunkwise --backward 1 --variant gdn,kda --H 16 --sets 1)
"$KCP" "${BENCH[@]}" --T 8192,32768 --warmup 2 --repeat 10 2>&1 | grep -E "^\| (gdn|kda)" | sort -u | tee "$LOGS/bwd_bench.txt"
KCP_CUDA_STAGE_TIMES=1 "$KCP" "${BENCH[@]}" --T 8192 --warmup 1 --repeat 1 2>&1 | grep "backward stages" | tee "$LOGS/bwd_stages.txt"
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool racecheck "$TEST" -tc='*stages match*' > "$LOGS/bwd_racecheck.log" 2>&1
  tail -1 "$LOGS/bwd_racecheck.log"
fi
