#!/usr/bin/env bash
# Captures real FLA calls across the flag matrix (scripts/gpu_capture.py, issue 13) and, when this
# build's kcp has `check` (HDF5), judges them. Each case runs in its own process, CAPTURE_JOBS at a
# time (default: the number of cores), because Triton's cold compile (40-110 s a case) is CPU-bound
# and the cases share no kernels; the per-case logs are <case>.log next to the files.
# The lent GPU machine has no HDF5 headers: there the files land in the output folder and are checked
# on a machine with HDF5 (`kcp check DIR`).
#   scripts/gpu_capture.sh [OUT_DIR] [BUILD_DIR]   defaults $OUT/captures (or gpu-logs/captures), build/
#   CAPTURE_CASES="kda_lb_nosafe_f32 gla_f32"      only these cases (scripts/gpu_capture.py --list)
#   needs torch, triton and FLA importable (e.g. PYTHONPATH=<fla checkout>); skipped otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${OUT:-gpu-logs}/captures}
BUILD=${2:-build}
if ! python3 -c "import torch, triton, fla" 2>/dev/null; then
  echo "gpu_capture: FLA (or torch/triton) not importable: skipped"; exit 0
fi
mkdir -p "$DIR"
jobs=${CAPTURE_JOBS:-$(nproc)}
cases=${CAPTURE_CASES:-$(python3 scripts/gpu_capture.py --list)}
printf '%s\n' $cases \
  | timeout "${CAPTURE_TIMEOUT:-540}" xargs -P "$jobs" -I{} \
      sh -c 'python3 scripts/gpu_capture.py --summary "summary-$1.json" "$0" "$1" > "$0/$1.log" 2>&1' "$DIR" {}
python3 scripts/gpu_capture.py --merge "$DIR" $cases | tee "$DIR/capture.log"
rc=${PIPESTATUS[0]}
if [ -x "$BUILD/kcp" ] && "$BUILD/kcp" help 2>&1 | grep -qE '^  check '; then
  "$BUILD/kcp" check --json "$DIR/check.json" "$DIR" | tee "$DIR/check.log"
  rc=$((rc | PIPESTATUS[0]))
else
  echo "gpu_capture: this kcp has no 'check' (built without HDF5): run 'kcp check $DIR' where HDF5 is"
fi
exit "$rc"
