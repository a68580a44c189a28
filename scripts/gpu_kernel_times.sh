#!/usr/bin/env bash
# Where one call's wall time goes on the GPU: every kernel of one forward+backward with its duration at
# the GPU's own clocks (ncu --clock-control none --cache-control none: neither locked clocks nor flushed
# caches, so the durations are the bench's, except that ncu runs the kernels one at a time and the side
# stream's fingerprint no longer overlaps a chain), their sum against the bench's median of the same
# arguments: the difference is what is not in kernels (launch gaps, the host's start; the lent machine
# has no nsys for a timeline). Summary lines go to $OUT/kernel_times.txt.
# There (after `tar xzf .gpu.tgz`, scripts/gpu_pack.sh): OUT=... [KCP=.gpu/kcp] [ARGS="..."] scripts/gpu_kernel_times.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
KCP=${KCP:-.gpu/kcp}
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
ARGS=${ARGS:---variant gdn --H 16 --T 8192 --backward 1 --keep 1}
S=$OUT/kernel_times.txt
read -r -a A <<< "$ARGS"
B=(bench --backend cuda-chunkwise --dtype bfloat16 --check 0 "${A[@]}")
echo "== $KCP ${B[*]}" >> "$S"
$KCP "${B[@]}" --warmup 3 --repeat 20 2>&1 | grep -E '^\| [a-z]+ \| [0-9]' | head -1 >> "$S"
# run(0) and one timed call: the second half of the kernels is the timed call's
ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  $KCP "${B[@]}" --warmup 0 --repeat 1 > "$OUT/ncu_times.csv" 2> "$OUT/ncu_times.err"
python3 - "$OUT/ncu_times.csv" >> "$S" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and r[12] == "gpu__time_duration.sum"]
half = rows[len(rows) // 2:]
unit = half[0][13] if half else "ns"
scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
tot = 0.0
for r in half:
    us = float(r[14].replace(",", "")) * scale
    tot += us
    print(f"  {us:9.1f} us  stream {r[6]:>3}  grid {r[8]:>14}  block {r[7]:>12}  {r[4][:90]}")
print(f"  kernels of the timed call: {len(half)} of {len(rows)}; sum {tot:.1f} us")
EOF
cat "$S"
