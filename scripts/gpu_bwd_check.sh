#!/usr/bin/env bash
# The backward's GPU check (issues 11 and 16): the other test cases of test_cuda first (forward,
# stages, transitions, goldens: fwd_tests.log), the backward test cases of test_cuda (oracle sweep,
# stages against the CPU twin, transition_backward, the gla golden gradients), `kcp check` of the
# golden files' gradients, forward and forward+backward times with FLA's in the same call, the
# per-stage split (KCP_CUDA_STAGE_TIMES=1), and racecheck on the stage test. Builds nothing: run
# scripts/gpu_build.sh first. About 1 minute on an H100.
#   scripts/gpu_bwd_check.sh [DIR]    DIR holds test_cuda and kcp (default build/, as built there);
#                                     logs go to $OUT when set, else gpu-logs/
#   BWD_VARIANTS=gla scripts/gpu_bwd_check.sh build-gpu    only these variants (comma list; default
#                                     gdn,kda,gla for the tests and kcp check, gdn,kda for the times)
# FLA (for its times) from FLA_PATH, default ./.fla (carried); skipped with a message if absent.
# HDF5 for `kcp check`: .deps/hdf5/lib (scripts/gpu_deps.sh) is put on LD_LIBRARY_PATH when present.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
TEST=$DIR/tests/cuda/test_cuda
[ -x "$TEST" ] || TEST=$DIR/test_cuda
KCP=$DIR/kcp
. scripts/gpu_env.sh  # LD_LIBRARY_PATH (.deps HDF5, lib/), KCP_SOURCE_DIR
export FLA_PATH=${FLA_PATH:-$PWD/.fla}
VARS=${BWD_VARIANTS:-}
filter=()
if [ -n "$VARS" ]; then  # subcases are named by variant ("gla(B=1,...)") or file ("gla_fp32_basic.h5")
  filter=(-sc="$(echo "$VARS" | sed 's/\([a-z][a-z]*\)/\1*/g')")
  [[ ,$VARS, == *,gla,* ]] || filter+=(-tce='*gla golden*')  # that test case needs its gla files
fi
TIMED=${VARS:-gdn,kda}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

"$TEST" -tce='*backward*' "${filter[@]:0:1}" > "$LOGS/fwd_tests.log" 2>&1  # forward, stages, transitions, goldens
echo "forward tests (${VARS:-all variants}): rc=$?"
grep -E "test cases:|assertions:" "$LOGS/fwd_tests.log"
grep -E "^\| gla_.*\.h5 \|" "$LOGS/fwd_tests.log" || true  # the gla golden outputs against FLA's
"$TEST" -tc='*backward*' "${filter[@]}" > "$LOGS/bwd_tests.log" 2>&1
echo "backward tests (${VARS:-all variants}): rc=$?"
grep -E "test cases:|assertions:" "$LOGS/bwd_tests.log"
grep -E "^\| gla_.*\.h5 \| d" "$LOGS/bwd_tests.log" || true  # the gla golden gradients against FLA's

if "$KCP" help 2>&1 | grep -qE '^  check '; then
  golden=()
  for v in $(echo "${VARS:-gdn,kda,gla}" | tr , ' '); do golden+=(data/golden/"$v"_*.h5); done
  "$KCP" check --backend cuda-chunkwise --precision f32 "${golden[@]}" > "$LOGS/bwd_golden_check.log" 2>&1
  echo "kcp check ${golden[*]}: rc=$?"
  tail -4 "$LOGS/bwd_golden_check.log"
else
  echo "kcp check: this build has no io (HDF5): skipped"
fi

BENCH=(bench --backend cuda-chunkwise --variant "$TIMED" --H 16)  # 3 input sets, as FLA's timing
TIMES=(--T 8192,32768 --warmup 3 --repeat 20)
"$KCP" "${BENCH[@]}" "${TIMES[@]}" 2>&1 | grep -E "^\| (gdn|kda|gla)" | sort -u | tee "$LOGS/fwd_bench.txt"
"$KCP" "${BENCH[@]}" "${TIMES[@]}" --backward 1 2>&1 | grep -E "^\| (gdn|kda|gla)" | sort -u | tee "$LOGS/bwd_bench.txt"
if [ -d "$FLA_PATH/fla" ]; then
  shapes=$(for v in ${TIMED//,/ }; do printf '%s:8192:16,%s:32768:16,' "$v" "$v"; done)
  python3 scripts/bench_fla_backward.py --shapes "${shapes%,}" --forward --kcp "$LOGS/fwd_bench.txt" 2>&1 |
    tee "$LOGS/fla_fwd.txt"
  python3 scripts/bench_fla_backward.py --shapes "${shapes%,}" --kcp "$LOGS/bwd_bench.txt" 2>&1 | tee "$LOGS/fla_bwd.txt"
else
  echo "FLA not found at $FLA_PATH: FLA's times skipped"
fi
KCP_CUDA_STAGE_TIMES=1 "$KCP" "${BENCH[@]}" --backward 1 --T 8192 --warmup 1 --repeat 1 2>&1 | grep "stages" | sort | uniq -c |
  tee "$LOGS/bwd_stages.txt"  # forward and backward stage split (counts: how often each line came)
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool racecheck "$TEST" -tc='*stages match*' "${filter[@]}" > "$LOGS/bwd_racecheck.log" 2>&1
  tail -1 "$LOGS/bwd_racecheck.log"
fi
