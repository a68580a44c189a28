#!/usr/bin/env bash
# Intra-card CP on a Hopper GPU (issue 12; docs/CP.md "Intra-card CP"), one job: build (unless
# BUILD_DIR already holds kcp and test_cuda), the CUDA tests that cover it (the segmented forward
# against unsplit cuda-chunkwise and the oracle, the device scan, the transition algebra whose fold
# kernel now shares its step with the scan; FULL=1: all of test_cuda), the golden files through the
# forced split when this build has `kcp check`, then `kcp bench --explain` for gdn and kda at
# T = 8192, 32768, H = 16 with the plan off, automatic and forced at 4096 .. 512 tokens (the data to
# calibrate the planner's model, segment/plan.h), packed 16 x 2048, and KCP_CUDA_SEGMENT read from
# the environment. Logs and a summary in $OUT (else gpu-logs/); exit 1 when a test fails.
#   scripts/gpu_segments.sh [BUILD_DIR]     default build-gpu/ (scripts/gpu_build.sh builds it; carry
#                                           .deps from scripts/gpu_deps.sh for `kcp check` and doctest)
#   REPEAT=20 SETS=2 SEGMENTS="4096 2048 1024 512" FULL=1   (defaults shown but FULL)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
. scripts/gpu_env.sh  # LD_LIBRARY_PATH (.deps HDF5, lib/), KCP_SOURCE_DIR
REPEAT=${REPEAT:-20}
SETS=${SETS:-2}
SEGMENTS=${SEGMENTS:-4096 2048 1024 512}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/device: /' \
  | tee "$LOGS/device.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$LOGS/device.txt"
test_cuda=$(find "$BUILD" -name test_cuda -type f -perm -u+x 2>/dev/null | head -1)
if [ ! -x "$BUILD/kcp" ] || [ -z "$test_cuda" ]; then
  echo "building in $BUILD (scripts/gpu_build.sh) ..."
  t0=$SECONDS
  OUT=$LOGS scripts/gpu_build.sh "$BUILD" > "$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  test_cuda=$(find "$BUILD" -name test_cuda -type f -perm -u+x | head -1)
fi

rc=0
filter='*segment*,*scan*,*transition*'
[ -n "${FULL:-}" ] && filter='*'
t0=$SECONDS
"$test_cuda" -tc="$filter" > "$LOGS/test_cuda_segments.log" 2>&1 || rc=1
echo "test_cuda -tc='$filter': $([ $rc = 0 ] && echo passed || echo FAILED), $((SECONDS - t0)) s"
tail -4 "$LOGS/test_cuda_segments.log"
grep -E '^  (o|final_state) ' "$LOGS/test_cuda_segments.log" | sort -k3 -g | tail -3 | sed 's/^/worst cut error: /'

if "$BUILD/kcp" help 2>&1 | grep -qE '^  check '; then  # every golden gdn/kda file through the forced split
  KCP_CUDA_SEGMENT=64 "$BUILD/kcp" check --backend cuda-chunkwise --precision f32 data/golden/gdn_*.h5 \
    data/golden/kda_*.h5 > "$LOGS/golden_segment64.log" 2>&1
  g=$?
  [ $g -ne 0 ] && rc=1
  echo "golden check with KCP_CUDA_SEGMENT=64: rc $g"; tail -3 "$LOGS/golden_segment64.log"
fi

bench() {  # log name, then kcp bench arguments
  local name=$1; shift
  "$BUILD/kcp" bench --backend cuda-chunkwise --repeat "$REPEAT" --sets "$SETS" --explain "$@" > "$LOGS/$name.log" 2>&1
  local r=$?
  [ $r -ne 0 ] && { echo "bench $name: rc $r"; tail -5 "$LOGS/$name.log"; rc=1; }
  echo "## $name: $*"
  sed -n '/^| op /,$p' "$LOGS/$name.log" | tail -n +3
}
{
  for s in off auto $SEGMENTS; do bench "bench_segment_$s" --variant gdn,kda --T 8192,32768 --H 16 --segment "$s"; done
  bench bench_packed_16x2048 --variant gdn,kda --T 32768 --seqs 16 --H 16
  KCP_CUDA_SEGMENT=1024 bench bench_env_1024 --variant gdn --T 8192 --H 16
} | tee "$LOGS/summary.md"
exit $rc
