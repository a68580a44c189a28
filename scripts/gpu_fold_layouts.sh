#!/usr/bin/env bash
# The folded gdn state kernel's block layouts on a Hopper GPU (cuda/chunk_state_fold.cu;
# KCP_CUDA_STATE_GROUPS: "1", "2" one warpgroup of 16 or 32 columns, "2x2" two warpgroups of 32
# sharing a chunk's loaded tiles; unset: fold_layout.h's automatic layout), one job:
#   tests: the stage test (every layout), all of test_cuda, then under each of TEST_LAYOUTS (default
#          2x2) the forward, transition, segment, kept and golden tests, racecheck and memcheck of a
#          small gdn forward+backward (kept, fused), and the gdn golden files cut at 64 tokens;
#   bench: gdn's forward per layout (auto and each forced one; .gpu/kcp_base too at one sequence of
#          H = 16, or everywhere with BASE_ALL=1) over SHAPES, and forward+backward (keep 1) of auto
#          against the base over BWD_SHAPES; PROF=1: ncu of layouts 1 and 2x2 (instruction mix), and
#          layout 1's SASS with stall samples per instruction ($OUT/ncu_sass_1.csv).
# The rows give the step time of each layout, the figures fold_layout.h's model is built from.
# Summary in $OUT/summary.txt (else gpu-logs/); exit 1 when a test fails.
# Here: BINS="kcp tests/cuda/test_cuda" BASE_KCP=<base kcp> scripts/gpu_pack.sh <dir>; there (carry
# .gpu.tgz):  OUT=$OUT scripts/gpu_fold_layouts.sh   [LAYOUTS="auto 1 2 2x2"] [TESTS=0]
#             [SHAPES="T:seqs:H ..."] [BWD_SHAPES="T:seqs:H ..."] [BASE_ALL=1] [FWD_REPS=1] [PROF=1]
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_packed_env.sh  # OUT, S, L; the pack unpacked, its environment
K=.gpu/kcp; TC=.gpu/test_cuda
LAYOUTS=${LAYOUTS:-auto 1 2 2x2}
SHAPES=${SHAPES:-8192:1:16 32768:1:16 8192:1:32 16384:2:16 32768:4:16 32768:16:16 8192:1:64}
BWD_SHAPES=${BWD_SHAPES:-8192:1:16 32768:4:16 32768:16:16}
rc=0
{ date; nvidia-smi --query-gpu=name --format=csv,noheader; } > $S
# the environment of a column (a layout, or automatic), and its command: the new build or the base
envof() { case $1 in base | auto) echo "env -u KCP_CUDA_STATE_GROUPS" ;; *) echo "env KCP_CUDA_STATE_GROUPS=$1" ;; esac; }
bin() { [ "$1" = base ] && echo "$(envof base) .gpu/kcp_base" || echo "$(envof $1) $K"; }
if [ "${TESTS:-1}" = 1 ]; then
  timeout 120 $TC -tc='*stage*' > $L/stages.log 2>&1 || rc=1
  echo "stages (every layout): $(grep -E 'test cases:' $L/stages.log)" >> $S
  timeout 300 $TC > $L/test_cuda.log 2>&1 || rc=1
  echo "test_cuda (automatic layout): $(grep -E 'test cases:' $L/test_cuda.log)" >> $S
  for l in ${TEST_LAYOUTS:-2x2}; do  # 1 and 2 are the automatic layout's at some shapes of test_cuda too
    $(envof $l) $TC -tc='*forward*,*transition*,*segment*,*kept*,*golden*' > $L/tests_$l.log 2>&1 || rc=1
    echo "layout $l: test_cuda forward/transition/segment/kept/golden: $(grep -E 'test cases:' $L/tests_$l.log)" >> $S
    SB=(bench --backend cuda-chunkwise --variant gdn --H 2 --T 200 --warmup 0 --repeat 1 --backward 1)
    $(envof $l) compute-sanitizer --tool racecheck $K "${SB[@]}" --fused 1 --keep 1 > $L/race_$l.log 2>&1 || rc=1
    echo "layout $l racecheck: $(tail -1 $L/race_$l.log)" >> $S
    $(envof $l) compute-sanitizer --tool memcheck $K "${SB[@]}" > $L/mem_$l.log 2>&1 || rc=1
    echo "layout $l memcheck: $(tail -1 $L/mem_$l.log)" >> $S
    KCP_CUDA_SEGMENT=64 $(bin $l) check --backend cuda-chunkwise --precision f32 data/golden/gdn_*.h5 \
      > $L/golden_seg_$l.log 2>&1 || rc=1
    echo "layout $l golden gdn, cut at 64: $(tail -1 $L/golden_seg_$l.log)" >> $S
  done
fi
# one row: the table line (median / min) and the stage split from one more run with stage times
row() {  # column, label, then bench arguments
  local col=$1 lab=$2; shift 2
  timeout 120 $(bin $col) bench --backend cuda-chunkwise --variant gdn --warmup 3 --repeat 20 --explain "$@" \
    > $L/b.log 2>&1 || echo "  (rc $?)" >> $S
  KCP_CUDA_STAGE_TIMES=1 timeout 120 $(bin $col) bench --backend cuda-chunkwise --variant gdn --check 0 \
    --warmup 1 --repeat 1 "$@" > $L/bs.log 2>&1
  echo "$lab $col: $(grep -E '^\| gdn' $L/b.log | head -1 | cut -d'|' -f2-7,14-16) | $(grep -E '(forward|backward) stages' $L/bs.log | tail -2 | sed 's/.*(ms)://' | tr '\n' ' ')" >> $S
}
for sh in $SHAPES; do
  IFS=: read -r T n H <<< "$sh"
  ck=0; [ $T -le 16384 ] && [ $H -le 16 ] && ck=1
  cols=$LAYOUTS; { [ $n = 1 ] && [ $H = 16 ] || [ "${BASE_ALL:-0}" = 1 ]; } && cols="$cols base"  # the bars' shapes
  for rep in $(seq ${FWD_REPS:-1}); do for col in $cols; do row $col "fwd T=$T seqs=$n H=$H" --T $T --seqs $n --H $H --backward 0 --check $ck; done; done
done
for sh in $BWD_SHAPES; do
  IFS=: read -r T n H <<< "$sh"
  ck=0; [ $T -le 8192 ] && ck=1
  for rep in 1 2; do for col in auto base; do
    row $col "fwd+bwd T=$T seqs=$n H=$H" --T $T --seqs $n --H $H --backward 1 --keep 1 --check $ck
  done; done
done
# PROF=1: ncu of the chain kernel under layouts 1 (H = 16) and 2x2 (H = 64), T = 8192 (128 blocks of 128
# steps each): issue, warp states and the instruction mix by opcode (what the step's instructions are,
# docs/CUDA.md's next steps), in $OUT/ncu_<layout>.txt
if [ "${PROF:-0}" = 1 ]; then
  for c in 1:16 2x2:64; do
    l=${c%%:*}; H=${c##*:}
    $(envof $l) timeout 120 ncu -k regex:chunk_state_fold --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section InstructionStats --print-details all $K bench --backend cuda-chunkwise \
      --variant gdn --H $H --T 8192 --backward 0 --check 0 --warmup 1 --repeat 1 --sets 1 > $OUT/ncu_$l.txt 2>&1
    echo "ncu layout $l (H = $H): rc $?, $(grep -E 'Issue Slots Busy' $OUT/ncu_$l.txt | head -1 | tr -s ' ')" >> $S
  done
  # layout 1's SASS with its stall samples per instruction (where a step waits), as CSV
  env KCP_CUDA_STATE_GROUPS=1 timeout 150 ncu -k regex:chunk_state_fold --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv $K bench \
    --backend cuda-chunkwise --variant gdn --H 16 --T 8192 --backward 0 --check 0 --warmup 1 --repeat 1 --sets 1 \
    > $OUT/ncu_sass_1.csv 2>&1
  echo "ncu layout 1 SASS stall samples: rc $?, $(wc -l < $OUT/ncu_sass_1.csv) lines" >> $S
fi
cat $S
exit $rc
