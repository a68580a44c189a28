#!/usr/bin/env bash
# Same-call A/B on the lent GPU (docs/BENCHMARKS.md: "each change and its base built in the same
# call"): the working tree ("new") and a base tree, built side by side on the device; then on new:
# test_cuda, `kcp check --precision f32` of data/golden with and without KCP_CUDA_KEEP=1, racecheck
# and memcheck on a small forward+backward of gdn, kda, gla (racecheck also with --fused 1, gdn and kda); then `kcp bench --backward 1 --keep 1`
# of new and base alternating (T = 8192 twice, 32768 once, per variant; gdn float32 at 8192), the
# medians from runs without stage times and one stage line each from one more run with
# KCP_CUDA_STAGE_TIMES=1 (ab_line); then, unless PROF=0, ncu (--set full) of six kernels
# with their SASS-level csv (tools/ncu_sass.py reads them). A summary in $OUT/summary.txt, logs in
# $OUT/logs.tgz and $OUT/prof.tgz (eight files at most come back from the device). About 6-9 minutes.
# Here, before the call (the base is any commit; .gpu/ and .deps/ are git-ignored, carry both):
#   git archive --prefix=base/ <commit> | gzip > .gpu/base.tgz; scripts/gpu_deps.sh
# Or PREBUILT=1 (no builds there, ~90 s less device time): both trees built here, the new one packed
# by scripts/gpu_pack.sh with the base's stripped kcp added as .gpu/kcp_base before its tar (carry
# .gpu.tgz only, not .gpu: the carry limit counts bytes).
# There:   [VARS="gdn kda gla"] [REPS32=1] [FWD=1 [FWD_VARS=...]] [PROF=0 | PROFS="name:variant:kernel-regex ..."]
#          [FLA_SHAPES="gla:8192:16,gla:32768:16"] [MPI_SWEEP=1] [ENVS="label:NAME=value ..."] [FUSED_VARS="gdn"]
#          scripts/gpu_ab.sh
# TESTS=0: no test_cuda, goldens or sanitizers (a timing-only call; the benches at T = 8192 still check
# their outputs against the oracle): only for candidates whose tests run in a later call before landing.
# .gpu/kcp_alt (PREBUILT, gpu_pack.sh ALT_KCP=...): a second candidate, timed as column "alt".
# MPI_SWEEP=1: after the tests, `kcp cp-sweep --quick` with 2 ranks over MPI sharing the one GPU, with
# and without KCP_CUDA_KEEP=1 (the CP layer's calls on cuda-chunkwise where no second GPU is lent).
# FLA_SHAPES (carry .fla): FLA's forward and forward+backward of those shapes in the same call
# (scripts/bench_fla_backward.py), once during the builds or, with PREBUILT=1, the tests (Triton's
# compile and autotuning, untimed; up to 300 s, which the benches wait for) and once, timed, after
# kcp's benches; the table lines go to the summary. On 2026-11-29 the warm-up beside two builds on
# 16 cores passed its 300 s limit for gla at T = 8192 and 32768, so FLA's forward+backward went untimed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
S=$OUT/summary.txt; L=$OUT/logs; mkdir -p $L
date > $S; nvidia-smi --query-gpu=name --format=csv,noheader >> $S
export LD_LIBRARY_PATH=$PWD/.deps/hdf5/lib:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
. scripts/gpu_fla_timing.sh  # fla, fla_warm_up, fla_tables
. scripts/gpu_ab_build.sh  # ab_build (new and base side by side) or ab_unpack (PREBUILT)
if [ "${PREBUILT:-0}" = 1 ]; then  # binaries built here (scripts/gpu_pack.sh, plus the base kcp as kcp_base)
  need=kcp_base; [ "${TESTS:-1}" = 1 ] && need="kcp_base test_cuda"
  ab_unpack "$need" || exit 1
  N=.gpu/kcp; B=.gpu/kcp_base; TC=.gpu/test_cuda
  # FLA's Triton warm-up beside the tests (there are no builds to hide it behind; the benches wait for
  # it below). Without it FLA's forward+backward is not timed (fla_tables).
  fla_warm_up &
else
  fla_warm_up &
  ab_build "kcp test_cuda"
  echo "builds $(( $(date +%s) - t0 )) s" >> $S
  N=build-gpu/kcp; B=/tmp/b/build/kcp
  [ -x $N ] && [ -x $B ] || { tail -30 $L/build_new.log $L/build_base.log >> $S; exit 1; }
  TC=build-gpu/tests/cuda/test_cuda; [ -x $TC ] || TC=build-gpu/test_cuda
fi
if [ "${TESTS:-1}" = 1 ]; then
timeout 300 $TC > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?" >> $S; grep -E "test cases:|assertions:" $L/test_cuda.log >> $S
$N check --backend cuda-chunkwise --precision f32 data/golden > $L/golden.log 2>&1; echo "golden rc=$?" >> $S; tail -2 $L/golden.log >> $S
KCP_CUDA_KEEP=1 $N check --backend cuda-chunkwise --precision f32 data/golden > $L/golden_keep.log 2>&1; echo "golden keep rc=$?" >> $S; tail -2 $L/golden_keep.log >> $S
SB=(bench --backend cuda-chunkwise --variant gdn,kda,gla --H 2 --T 200 --backward 1 --warmup 0 --repeat 1)
compute-sanitizer --tool racecheck $N "${SB[@]}" > $L/race.log 2>&1; echo "racecheck rc=$?" >> $S; tail -1 $L/race.log >> $S
# the fused paths (L2 norm, beta sigmoid, gate formula in the kernels), which the line above does not take
compute-sanitizer --tool racecheck $N "${SB[@]/gdn,kda,gla/gdn,kda}" --fused 1 --keep 1 > $L/race_fused.log 2>&1
echo "racecheck fused rc=$?" >> $S; tail -1 $L/race_fused.log >> $S
compute-sanitizer --tool memcheck $N "${SB[@]}" > $L/mem.log 2>&1; echo "memcheck rc=$?" >> $S; tail -1 $L/mem.log >> $S
else
  echo "TESTS=0: no tests in this call" >> $S
fi
[ "${MPI_SWEEP:-0}" = 1 ] && (
  . scripts/gpu_mpi.sh  # mpi: the mpirun prefix (in a subshell: it exports KCP_CUDA_KEEP)
  for keep in 0 1; do
    KCP_CUDA_KEEP=$keep timeout 240 "${mpi[@]}" 2 $N cp-sweep --quick --backend cuda-chunkwise --comm mpi > $L/mpi2_keep$keep.log 2>&1
    echo "cp-sweep mpi np=2 (one GPU) keep=$keep rc=$?: $(grep -v '^\s*$' $L/mpi2_keep$keep.log | tail -1)" >> $S
  done
)
for x in ${ENVS:-}; do  # each ENVS setting's form tested before anything is timed under it
  IFS=: read -r lab kv <<< "$x"
  env "$kv" timeout 300 $TC > $L/test_cuda_env_$lab.log 2>&1
  echo "env $lab ($kv) test_cuda rc=$?: $(grep -E "test cases:" $L/test_cuda_env_$lab.log)" >> $S
done
echo "tests done $(( $(date +%s) - t0 )) s" >> $S
wait  # the FLA warm-up
VARS=${VARS:-gdn kda gla}
# One summary line: the table row (median / min ms) from a run without stage times, the backward's
# stage split from one more run with KCP_CUDA_STAGE_TIMES=1, whose events synchronize the device and
# inflate the medians (2026-11-29: +0.02-0.08 ms at T = 8192, docs/BENCHMARKS.md).
# ab_line label log "binary [env settings]" bench-arguments...
ab_line() {
  local lab=$1 log=$2 X=$3; shift 3
  timeout 120 $X "$@" --warmup 2 --repeat 10 > $log 2>&1
  local a=("$@"); for i in "${!a[@]}"; do [ "${a[$i]}" = --check ] && a[$((i + 1))]=0; done
  KCP_CUDA_STAGE_TIMES=1 timeout 120 $X "${a[@]}" --warmup 1 --repeat 1 > $log.stages 2>&1  # unchecked: checked above
  echo "$lab: $(grep -E '^\| [a-z]+ \| [0-9]' $log | head -1) | $(grep 'backward stages' $log.stages | tail -1 | sed 's/.*(ms)://')" >> $S
}
# A row's columns: new and base, and in the float32 and forward rows (FWD=1) new under each ENVS
# setting (ab_tags); ab_bin gives a column's command.
ab_cand() { echo new base; [ -x .gpu/kcp_alt ] && echo alt; }
ab_tags() { ab_cand; for x in ${ENVS:-}; do echo "${x%%:*}"; done; }
ab_bin() {
  case $1 in
    new) echo "$N" ;;
    base) echo "$B" ;;
    alt) echo .gpu/kcp_alt ;;
    *) for x in ${ENVS:-}; do [ "${x%%:*}" = "$1" ] && echo "env ${x#*:} $N"; done ;;
  esac
}
for T in 8192 32768; do
 ck=1; [ $T = 32768 ] && ck=0
 for v in $VARS; do
  reps="1 2"; [ $T = 32768 ] && reps=$(seq -s' ' 1 ${REPS32:-1})
  for rep in $reps; do
   for tag in $(ab_cand); do
    X=$(ab_bin $tag)
    ab_line "$tag $v T=$T" $L/b_${v}_${T}_${tag}_$rep.log $X bench --backend cuda-chunkwise --variant $v --H 16 --T $T --backward 1 --keep 1 --check $ck
   done
  done
 done
done
for v in gdn; do for tag in $(ab_tags); do
  X=$(ab_bin $tag)
  ab_line "$tag $v f32 T=8192" $L/f32_${v}_${tag}.log $X bench --backend cuda-chunkwise --variant $v --H 16 --T 8192 --dtype float32 --backward 1 --keep 1 --check 1
done; done
# FWD=1: the forward alone (keep 0), new and base (and the ENVS settings) alternating, each of
# FWD_VARS (default VARS) at both lengths, and a stage line from one more run of each.
[ "${FWD:-0}" = 1 ] && for T in 8192 32768; do for v in ${FWD_VARS:-$VARS}; do for tag in $(ab_tags); do
  X=$(ab_bin $tag)
  FB=(bench --backend cuda-chunkwise --variant $v --H 16 --T $T --backward 0 --check 0)
  timeout 60 $X "${FB[@]}" --warmup 3 --repeat 20 > $L/fwd.log 2>&1
  KCP_CUDA_STAGE_TIMES=1 timeout 60 $X "${FB[@]}" --warmup 1 --repeat 1 > $L/fwds.log 2>&1
  echo "$tag $v fwd T=$T: $(grep -E "^\| $v" $L/fwd.log | head -1) | $(grep 'forward stages' $L/fwds.log | tail -1 | sed 's/.*(ms)://')" >> $S
done; done; done
# FUSED_VARS="gdn kda": new and base alternating with --fused 1 (the L2 norm, beta sigmoid and gate
# formula inside the kernels, FLA's layer call), each of those variants at both lengths.
for T in 8192 32768; do for v in ${FUSED_VARS:-}; do for tag in new base; do
  X=$(ab_bin $tag)
  ck=1; [ $T = 32768 ] && ck=0
  ab_line "$tag $v fused T=$T" $L/fused_${v}_${T}_$tag.log $X bench --backend cuda-chunkwise --variant $v --H 16 --T $T --fused 1 --backward 1 --keep 1 --check $ck
done; done; done
# ENVS="label:NAME=value ...": the new binary once more under each setting (a study's forms selected
# at run time in one build, as KCP_HV_MODE was on study/hv-overlap, KCP_CUDA_GLA_CHAIN_COLS on
# next/gla-chain-cols): its test_cuda ran with the tests above; here each of VARS at both lengths. The
# float32 and FWD rows give each setting a column of their own (ab_tags). These rows come last: a
# call cut by its limit (2026-11-29, five settings) loses them, not the forward rows.
for x in ${ENVS:-}; do
  IFS=: read -r lab kv <<< "$x"
  for T in 8192 32768; do for v in $VARS; do
    ck=1; [ $T = 32768 ] && ck=0
    ab_line "env $lab ($kv) $v T=$T" $L/env_${lab}_${v}_$T.log "env $kv $N" bench --backend cuda-chunkwise --variant $v --H 16 --T $T --backward 1 --keep 1 --check $ck
  done; done
done
fla_tables
P=$OUT/prof; mkdir -p $P
prof() {  # name variant kernel-regex
  timeout 100 ncu --set full -k regex:$3 --launch-count 1 -o $P/$1 $N bench --backend cuda-chunkwise --variant $2 --H 16 --T 8192 --backward 1 --keep 1 --check 0 --warmup 0 --repeat 1 > $P/$1.run.log 2>&1
  ncu -i $P/$1.ncu-rep > $P/$1.details.txt 2>&1
  ncu -i $P/$1.ncu-rep --page source --csv --print-source sass > $P/$1.sass.csv 2>&1; gzip $P/$1.sass.csv; rm -f $P/$1.ncu-rep
  echo "== $1: $(grep -E "^    Duration" $P/$1.details.txt | head -1)" >> $S
}
# PROFS: "name:variant:kernel-regex ..." (default: six kernels); PROF=0: none.
PROFS=${PROFS:-hv_gdn:gdn:bwd_hv_kernel kkt_kda:kda:chunk_kkt_kernel wyf_kda:kda:chunk_wy_kernel state_kda:kda:chunk_state_kernel wyb_kda:kda:bwd_wy_kernel dhu_gdn:gdn:bwd_dhu_kernel}
[ "${PROF:-1}" = 1 ] && for x in $PROFS; do IFS=: read -r pn pv pk <<< "$x"; prof "$pn" "$pv" "$pk"; done
echo "done $(( $(date +%s) - t0 )) s" >> $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L; [ -d $OUT/prof ] && tar czf $OUT/prof.tgz -C $OUT prof && rm -rf $OUT/prof
