#!/usr/bin/env bash
# cuda-chunkwise against FLA in the same call on the GPU machine (issues 11, 12 and 16's speed bars):
# for each shape of FLA_SHAPES (variant:T:H, or variant:T:H:N for N packed sequences as `kcp bench
# --seqs N`; K = V = 128, bf16 inputs as scripts/bench_fla_backward.py
# makes them), kcp's forward and forward+backward (--keep 1: the kept forward, as docs/BENCHMARKS.md's
# bars table times it), then FLA's same two, one table each with the ratio FLA / kcp.
# Order, so that nothing else runs on the GPU while anything is timed: FLA's untimed warm-up (Triton's
# compile and autotuning, shortened by a carried .fla-autotune.tgz: scripts/gpu_fla_timing.sh), kcp's
# runs (one row per shape, each the median of 20 forwards / 10 forward+backwards), FLA's timed runs,
# kcp's runs again: the FLA rows' ratio is against kcp's rows before them, the "after" lines against
# those after (a GPU that warms under the load shows as a difference). Summary in $OUT/summary.txt,
# logs in $OUT/logs/.
#   FLA_SHAPES="gla:8192:16,gla:32768:16" scripts/bench_backward.sh KCP_BINARY
# (carry .fla, and .fla-autotune.tgz if a former call returned one; KCP_BINARY as scripts/gpu_pack.sh
# packs it: LD_LIBRARY_PATH is set for .gpu/lib). About 2-7 minutes, most of it FLA's warm-up.
set -uo pipefail
cd "$(dirname "$0")/.."
KCP=${1:-.gpu/kcp}
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
S=$OUT/summary.txt; L=$OUT/logs; mkdir -p $L
export FLA_SHAPES=${FLA_SHAPES:-gdn:8192:16,gdn:32768:16,kda:8192:16}
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> $S  # (the device copy's git metadata may be stale: name the binary's commit in the notes)
. scripts/gpu_fla_timing.sh  # fla_warm_up, fla_tables
fla_warm_up
echo "fla warm-up $(( $(date +%s) - t0 )) s" >> $S
# kcp_rows REP: kcp's forward and forward+backward of every shape, rows into kcp_{fwd,bwd}_REP.txt.
kcp_rows() {
  local v T H
  : > $L/kcp_fwd_$1.txt; : > $L/kcp_bwd_$1.txt
  for s in ${FLA_SHAPES//,/ }; do
    IFS=: read -r v T H N <<< "$s"
    N=${N:-1}; C=$T; [ "$N" -gt 1 ] && C=${N}x$((T / N))  # the T column kcp prints (NxL packed)
    A=(bench --backend cuda-chunkwise --variant $v --H $H --T $T --seqs $N --check 0)
    timeout 120 $KCP "${A[@]}" --backward 0 --warmup 3 --repeat 20 > $L/k.log 2>&1
    grep -E "^\| $v \| $C " $L/k.log | head -1 | tee -a $L/kcp_fwd_$1.txt | sed "s/^/kcp fwd ($1): /" >> $S
    timeout 120 $KCP "${A[@]}" --backward 1 --keep 1 --warmup 2 --repeat 10 > $L/k.log 2>&1
    grep -E "^\| $v \| $C " $L/k.log | head -1 | tee -a $L/kcp_bwd_$1.txt | sed "s/^/kcp fwd+bwd ($1): /" >> $S
  done
}
# ratio_after WHAT FLA_LOG KCP_ROWS: FLA's median over kcp's in the rows taken after FLA's runs.
ratio_after() {
  awk -F'|' -v what="$1" 'NR == FNR { if ($2 ~ /[a-z]/) k[$2 $3 $4] = $5; next }
    $2 ~ /[a-z]/ && (($2 $3 $4) in k) { printf "FLA %s / kcp after:%s|%s|%s: %.3f / %.3f = %.2fx\n", what, $2, $3, $4, $5, k[$2 $3 $4], $5 / k[$2 $3 $4] }' \
    "$3" "$2" >> $S
}
# kcp before and after FLA's timed runs, so that a GPU warming under the load shows as a difference
# between the two (the FLA rows' ratio is against the rows before, the "after" lines against those after)
kcp_rows before
fla_tables $L/kcp_fwd_before.txt $L/kcp_bwd_before.txt
kcp_rows after
ratio_after fwd $L/fla_fwd.log $L/kcp_fwd_after.txt
[ -e $L/fla_bwd.log ] && ratio_after fwd+bwd $L/fla_bwd.log $L/kcp_bwd_after.txt
echo "done $(( $(date +%s) - t0 )) s (columns of the FLA rows: FLA ms, FLA peak MiB, kcp ms, kcp MiB held, FLA / kcp)" >> $S
