#!/usr/bin/env bash
# The GPU check of the shape adapter (issue 11, "Shapes beyond today's"; core/padded_backend.h), one job:
# build (unless BUILD_DIR already holds kcp and test_cuda), then
#   1. test_cuda_backend: the registry's supports() on K 16/48/96, V 16/40/72, chunk 32, and K = 256's reason;
#   2. test_cuda's shape cases (test_cuda_shapes.cpp): forward, backward, both transitions against the
#      float64 oracle at padded shapes, and strided device views;
#   3. the pad kernel's neighbours, unchanged by the registry's new wrapper: the transition and segment tests;
#   4. the golden files through the registry's cuda-chunkwise when this build has `kcp check` (their shapes
#      need no padding: the adapter must pass them through untouched);
#   5. `kcp bench --explain` forward and forward+backward at K = 48, V = 40 next to K = V = 64 (the padding's cost).
# Logs and a summary in $OUT (else gpu-logs/); exit 1 when a test fails.
#   scripts/gpu_shapes_check.sh [BUILD_DIR]   default build-gpu/ (scripts/gpu_build.sh builds it)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
. scripts/gpu_env.sh  # LD_LIBRARY_PATH (.deps HDF5, lib/), KCP_SOURCE_DIR

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /' | tee "$LOGS/device.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$LOGS/device.txt"
find_bin() { find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -1; }
test_cuda=$(find_bin test_cuda)
if [ ! -x "$BUILD/kcp" ] || [ -z "$test_cuda" ]; then
  echo "building in $BUILD (scripts/gpu_build.sh) ..."
  t0=$SECONDS
  OUT=$LOGS scripts/gpu_build.sh "$BUILD" > "$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  test_cuda=$(find_bin test_cuda)
fi
test_backend=$(find_bin test_cuda_backend)

rc=0
run() {  # log name, then the command
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local r=$?
  [ $r -ne 0 ] && rc=1
  echo "$name: $([ $r = 0 ] && echo passed || echo "FAILED (rc $r)"), $((SECONDS - t0)) s"
  grep -E "test cases:|assertions:" "$LOGS/$name.log"
}
run test_cuda_backend "$test_backend"
run test_cuda_shapes "$test_cuda" -tc='*padded shapes*,*pads strided*'
grep -E '^  \S+ +rel_l2' "$LOGS/test_cuda_shapes.log" | sort -k3 -g | tail -5 | sed 's/^/largest error: /'
grep -c 'backward skipped' "$LOGS/test_cuda_shapes.log" | sed 's/^/cases with the backward skipped (supports_backward): /'
run test_cuda_neighbours "$test_cuda" -tc='*transition*,*segment*,*scan*'

if "$BUILD/kcp" help 2>&1 | grep -qE '^  check '; then
  "$BUILD/kcp" check --backend cuda-chunkwise --precision f32 data/golden/*.h5 > "$LOGS/golden.log" 2>&1
  g=$?
  [ $g -gt 1 ] && rc=1  # 1 = a tensor failed: compare with main's count before blaming the adapter
  echo "golden check (registry cuda-chunkwise): rc $g"; tail -3 "$LOGS/golden.log"
fi

bench() {  # log name, then kcp bench arguments
  local name=$1; shift
  "$BUILD/kcp" bench --backend cuda-chunkwise --repeat 20 --sets 2 --explain "$@" > "$LOGS/$name.log" 2>&1 || rc=1
  echo "## $name: $*"
  sed -n '/^| op /,$p' "$LOGS/$name.log" | tail -n +3
}
{
  bench fwd_k48_v40 --variant gdn,kda --T 8192 --H 16 --K 48 --V 40
  bench fwd_k64_v64 --variant gdn,kda --T 8192 --H 16 --K 64 --V 64
  bench bwd_k48_v40 --variant gdn,kda --T 8192 --H 16 --K 48 --V 40 --backward 1
  bench bwd_k64_v64 --variant gdn,kda --T 8192 --H 16 --K 64 --V 64 --backward 1
} | tee "$LOGS/summary.md"
exit $rc
