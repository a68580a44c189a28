#!/usr/bin/env bash
# One binary, two settings of an environment switch, on the lent GPU (docs/BENCHMARKS.md): where a
# change sits behind a switch (KCP_CUDA_GLA_SEGMENT, KCP_CUDA_SEGMENT, ...) its A/B needs no second
# build. Binaries built on the Debian machine and carried (scripts/gpu_pack.sh -> .gpu.tgz, with
# .fla for FLA). Runs test_cuda, `kcp check --precision f32` of data/golden with and without
# KCP_CUDA_KEEP=1, racecheck and memcheck on a small forward+backward of gdn, kda, gla (under SAN);
# then `kcp bench` forward (keep 0) of each of VARS at T = 8192 and 32768 under A and B alternating,
# with a stage line each, the forward+backward (keep 1) once, and FLA's forward and forward+backward
# of FLA_SHAPES (warmed up during the tests). Summary in $OUT/summary.txt, logs in $OUT/logs.tgz.
#   here:  scripts/gpu_pack.sh
#   there: A="KCP_CUDA_GLA_SEGMENT=off" B="" VARS="gla" FLA_SHAPES="gla:8192:16,gla:32768:16" scripts/gpu_switch_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; L=$OUT/logs; S=$OUT/summary.txt; mkdir -p $L
tar xzf .gpu.tgz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
date > $S; nvidia-smi --query-gpu=name --format=csv,noheader >> $S
t0=$(date +%s); N=.gpu/kcp
A=${A:-}; B=${B:-}; VARS=${VARS:-gla}
. scripts/gpu_fla_timing.sh  # fla, fla_warm_up, fla_tables
fla_warm_up &
timeout 300 .gpu/test_cuda > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?" >> $S; grep -E "test cases:|assertions:" $L/test_cuda.log >> $S
for keep in 0 1; do
  KCP_CUDA_KEEP=$keep $N check --backend cuda-chunkwise --precision f32 data/golden > $L/golden_$keep.log 2>&1
  echo "golden keep=$keep rc=$?: $(tail -1 $L/golden_$keep.log)" >> $S
done
SB=(bench --backend cuda-chunkwise --variant gdn,kda,gla --H 2 --T 300 --backward 1 --warmup 0 --repeat 1)
for tool in racecheck memcheck; do  # under SAN (default: gla's chain forced into 1-chunk segments)
  eval "env ${SAN-KCP_CUDA_GLA_SEGMENT=1} compute-sanitizer --tool $tool $N ${SB[*]}" > $L/$tool.log 2>&1
  echo "$tool rc=$?: $(tail -1 $L/$tool.log)" >> $S
done
echo "tests done $(( $(date +%s) - t0 )) s" >> $S
wait
row() { grep -E "^\| $1" $2 | head -1; }
for T in 8192 32768; do for v in $VARS; do for rep in 1 2; do for tag in A B; do
  ck=1; [ $T = 32768 ] && ck=0  # the forward judged against the oracle first (T = 8192)
  FB=(bench --backend cuda-chunkwise --variant $v --H 16 --T $T --backward 0)
  eval "env ${!tag} timeout 90 $N ${FB[*]} --check $ck --warmup 3 --repeat 20" > $L/f_${v}_${T}_$tag.log 2>&1
  eval "env ${!tag} KCP_CUDA_STAGE_TIMES=1 timeout 60 $N ${FB[*]} --check 0 --warmup 1 --repeat 1" > $L/fs_${v}_${T}_$tag.log 2>&1
  echo "$tag fwd $v T=$T: $(row $v $L/f_${v}_${T}_$tag.log) | $(grep 'forward stages' $L/fs_${v}_${T}_$tag.log | tail -1 | sed 's/.*(ms)://')" >> $S
done; done; done; done
for T in 8192 32768; do for v in $VARS; do
  KCP_CUDA_STAGE_TIMES=1 timeout 120 $N bench --backend cuda-chunkwise --variant $v --H 16 --T $T --backward 1 --keep 1 --check 0 --warmup 2 --repeat 10 > $L/b_${v}_$T.log 2>&1
  echo "fwd+bwd $v T=$T: $(row $v $L/b_${v}_$T.log) | $(grep 'backward stages' $L/b_${v}_$T.log | tail -1 | sed 's/.*(ms)://')" >> $S
done; done
fla_tables
echo "done $(( $(date +%s) - t0 )) s" >> $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
