#!/usr/bin/env bash
# One GPU call for a change to a chain kernel (gdn's folded forward, kda's transposed chain, the
# backward's dhu): all of test_cuda, racecheck and memcheck of small gdn and kda forward+backward runs
# (kept, fused; kda with forced windows of 2 chunks, so that the one-launch chain's waits run, and
# without windows), then forward and forward+backward rows of the new build beside .gpu/kcp_base
# (scripts/gpu_pack.sh BASE_KCP=..., and .gpu/kcp_alt where ALT_KCP packed one) over ROWS, and with KT=1
# ncu's kernel times of each for KT_ARGS.
# Summary in $OUT/summary.txt; exit 1 when a test or a sanitizer fails.
# Here: BINS="kcp tests/cuda/test_cuda" BASE_KCP=<base kcp> scripts/gpu_pack.sh <dir>; there (carry
# .gpu.tgz):  OUT=$OUT scripts/gpu_chain_check.sh   [TESTS=0] [SAN=0] [ROWS="variant:T:seqs:H:backward ..."]
#             [KT=1] [KT_ARGS="--variant gdn --H 16 --T 8192 --backward 1 --keep 1"]
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_packed_env.sh  # OUT, S, L; the pack unpacked, its environment
K=.gpu/kcp
COLS="new base"; [ -x .gpu/kcp_alt ] && COLS="new alt base"
binof() { case $1 in new) echo $K ;; *) echo .gpu/kcp_$1 ;; esac; }
ROWS=${ROWS:-gdn:8192:1:16:1 gdn:32768:1:16:1 kda:8192:1:16:0 kda:32768:1:16:0 kda:8192:1:16:1 gdn:2048:16:16:1}
rc=0
{ date; nvidia-smi --query-gpu=name --format=csv,noheader; } > $S
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 .gpu/test_cuda > $L/test_cuda.log 2>&1 || rc=1
  echo "test_cuda: $(grep -E 'test cases:' $L/test_cuda.log)" >> $S
fi
if [ "${SAN:-1}" = 1 ]; then
  for c in gdn:auto kda:2 kda:0; do
    v=${c%%:*} w=${c##*:}
    SB=(bench --backend cuda-chunkwise --variant $v --H 2 --T 300 --warmup 0 --repeat 1 --backward 1)
    for tool in racecheck memcheck; do
      KCP_CUDA_KDA_WINDOW=$w timeout 150 compute-sanitizer --tool $tool $K "${SB[@]}" --fused 1 --keep 1 \
        > $L/${tool}_$v$w.log 2>&1 || rc=1
      echo "$tool $v (window $w): $(tail -1 $L/${tool}_$v$w.log)" >> $S
    done
  done
fi
for r in $ROWS; do
  IFS=: read -r v T n H bw <<< "$r"
  ck=0; [ $((T * n)) -le 8192 ] && ck=1
  for col in $COLS; do
    timeout 120 $(binof $col) bench --backend cuda-chunkwise --variant $v --warmup 3 --repeat 20 --T $T --seqs $n --H $H \
      --backward $bw --keep $bw --check $ck > $L/b.log 2>&1 || echo "  (rc $?)" >> $S
    echo "$v T=$T seqs=$n H=$H bwd=$bw $col: $(grep -E "^\| $v" $L/b.log | head -1 | cut -d'|' -f2-7,14-16)" >> $S
  done
done
if [ "${KT:-0}" = 1 ]; then
  for col in $COLS; do
    KCP=$(binof $col) ARGS="${KT_ARGS:---variant gdn --H 16 --T 8192 --backward 1 --keep 1}" OUT=$L/kt_$col \
      timeout 100 scripts/gpu_kernel_times.sh > /dev/null 2>&1
    { echo "kernel times ($col):"; cat $L/kt_$col/kernel_times.txt; } >> $S
  done
fi
cat $S
exit $rc
