#!/usr/bin/env bash
# Same-call A/B of context parallelism on a machine with several GPUs (issue 14; docs/CP.md): the
# working tree ("new") and a base tree built side by side there, then on new: test_cuda, the NCCL
# cp-sweep (one GPU per rank: N = 2 quick; full, with and without the kept forward, at N = 4, or at
# N = 2 on 2 or 3 GPUs), the NCCL
# fault job (it must end by itself with rank 1's message), one small NCCL run with NCCL_DEBUG=INFO
# (which transport the exchange takes); the CP transitions on one GPU (`kcp bench --transitions 1`,
# TRANS_OPS), new and base; then cp-bench over NCCL, new and base alternating, CP_OPS, kept forward,
# T = 32768 per rank, H = 16, K = V = 128, bf16, ranks 1, 2, 4 as far as the GPUs go, best of
# CP_REPEAT (10; the thirteenth session's rows were best of 3 and moved ~0.3 ms between runs); last, unless
# PROF=0, ncu of PROFS ("name:variant:kernel-regex ...", one GPU, T = 8192). With FLA_SHAPES
# ("op:T:H,..."; carry .fla): new's forward and forward+backward of those shapes, two runs each, and
# FLA's in the same call (scripts/gpu_fla_timing.sh). Summary in $OUT/summary.txt, logs in
# $OUT/logs.tgz (and prof.tgz). About 5-9 minutes on 4 GPUs.
# Here, before the call (.gpu/ and .deps/ are git-ignored; carry both):
#   git archive --prefix=base/ <commit> -- . ':!data' ':!docs' | gzip > .gpu/base.tgz; scripts/gpu_deps.sh
# Or PREBUILT=1 (no builds there): both trees built here, `BINS="kcp tests/cuda/test_cuda
# tests/cp/cp_fault_job" BASE_KCP=<base kcp> scripts/gpu_pack.sh <new build>` (carry .gpu.tgz, .deps).
# There:  [CP_OPS="gdn kda gla"] [TRANS_OPS="gla"] [CP_REPEAT=10] [PROF=0 | PROFS=...] [FLA_SHAPES=...]
#         [PREBUILT=1] [STAGES=1] [FLA_CP="2:nccl 2:nccl::2046,4,2046" [FLA_CP_LIMIT=240]] [SPIN_US=500]
#         scripts/gpu_cp_ab.sh      (an empty CP_OPS or TRANS_OPS leaves that part out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
S=$OUT/summary.txt; L=$OUT/logs; mkdir -p "$L"
date > "$S"; nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c >> "$S"
nvidia-smi topo -m > "$L/topo.txt" 2>&1
export LD_LIBRARY_PATH=$PWD/.deps/hdf5/lib:${LD_LIBRARY_PATH:-}
. scripts/gpu_mpi.sh  # KCP_NCCL_LIBRARY, gpus, mpi
t0=$(date +%s)
. scripts/gpu_fla_timing.sh  # fla, fla_warm_up, fla_tables (nothing without FLA_SHAPES)
fla_warm_up &
. scripts/gpu_ab_build.sh  # ab_build (new and base side by side) or ab_unpack (PREBUILT)
if [ "${PREBUILT:-0}" = 1 ]; then  # built here: scripts/gpu_pack.sh with BINS and BASE_KCP (header)
  ab_unpack "kcp_base test_cuda cp_fault_job" || exit 1
  N=.gpu/kcp; B=.gpu/kcp_base; BD=.gpu
else
  ab_build "kcp test_cuda cp_fault_job"
  echo "builds $(( $(date +%s) - t0 )) s, $gpus GPUs" >> "$S"
  N=build-gpu/kcp; B=/tmp/b/build/kcp; BD=build-gpu
  [ -x $N ] && [ -x $B ] || { tail -30 "$L/build_new.log" "$L/build_base.log" >> "$S"; exit 1; }
fi
step() {  # name, command...: its exit code and last line into the summary
  local name=$1; shift
  timeout 300 "$@" > "$L/$name.log" 2>&1
  echo "$name rc=$? ($(( $(date +%s) - t0 )) s): $(grep -v '^\s*$' "$L/$name.log" | tail -1)" >> "$S"
}
TC=$(find $BD -name test_cuda -type f -perm -u+x | head -1)
step test_cuda "$TC"
grep -E "test cases:|assertions:" "$L/test_cuda.log" >> "$S"
if [ "$gpus" -ge 2 ]; then
  step cp_sweep_nccl_np2_quick_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 2 $N cp-sweep --quick --backend cuda-chunkwise --comm nccl
  if [ "$gpus" -lt 4 ]; then  # the full sweep at the largest N this machine has
    step cp_sweep_nccl_np2 "${mpi[@]}" 2 $N cp-sweep --backend cuda-chunkwise --comm nccl
    step cp_sweep_nccl_np2_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 2 $N cp-sweep --backend cuda-chunkwise --comm nccl
  fi
  NCCL_DEBUG=INFO step nccl_transport "${mpi[@]}" 2 $N cp-sweep --quick --backend cuda-chunkwise --comm nccl --filter gdn
  grep -hoE "via (P2P|SHM|NET|IPC)[^ ]*( [A-Za-z/]+)?" "$L/nccl_transport.log" | sort | uniq -c | head -5 >> "$S"
  fault=$(find $BD -name cp_fault_job -type f -perm -u+x | head -1)
  step cp_fault_nccl "${mpi[@]}" 2 "$fault" throw cuda-chunkwise nccl  # must fail, by itself, with:
  grep -q "rank 1: error: injected fault" "$L/cp_fault_nccl.log" && echo "cp_fault_nccl: ended with rank 1's message: passed" >> "$S"
fi
if [ "$gpus" -ge 4 ]; then
  step cp_sweep_nccl_np4 "${mpi[@]}" 4 $N cp-sweep --backend cuda-chunkwise --comm nccl
  step cp_sweep_nccl_np4_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 4 $N cp-sweep --backend cuda-chunkwise --comm nccl
fi
wait  # the FLA warm-up (on GPU 0), before anything is timed
for op in ${TRANS_OPS-gla}; do for T in 8192 32768; do for tag in new base; do
  X=$N; [ $tag = base ] && X=$B
  ck=1; [ $T = 32768 ] && ck=0
  timeout 120 $X bench --backend cuda-chunkwise --variant $op --H 16 --T $T --transitions 1 --check $ck --warmup 2 --repeat 10 > "$L/tr_${op}_${T}_$tag.log" 2>&1
  echo "transitions $tag $op T=$T rc=$?: $(grep -E "^\| $op" "$L/tr_${op}_${T}_$tag.log" | head -1)" >> "$S"
done; done; done
ranks=1; [ "$gpus" -ge 2 ] && ranks=1,2; [ "$gpus" -ge 4 ] && ranks=1,2,4
# cp_bench label binary [mpirun options]: cp-bench of $op over NCCL (kept forward, T = 32768 per rank,
# H = 16, K = V = 128, bf16, ranks $ranks, best of CP_REPEAT), its rows into the summary.
cp_bench() {
  local lab=$1 x=$2 log="$L/cpb_${op}_$1.log"; shift 2
  timeout 200 "${mpi[@]}" "${ranks##*,}" "$@" $x cp-bench --backend cuda-chunkwise --comm nccl --keep 1 --variant $op \
    --ranks $ranks --repeat "${CP_REPEAT:-10}" --T 32768 --H 16 --K 128 --V 128 --dtype bfloat16 > "$log" 2>&1
  echo "== cp-bench $op $lab rc=$?" >> "$S"; grep -E "^ +[0-9]+ +[0-9]+ \|" "$log" >> "$S"
}
for op in ${CP_OPS-gdn kda gla}; do
  for tag in new base; do
    X=$N; [ $tag = base ] && X=$B
    cp_bench $tag $X
  done
done
# SPIN_US=N: new's cp-bench once more per CP_OPS op with KCP_NCCL_SPIN_US=N (its NCCL waits poll
# without sleeping for their first N us, cp/comm_nccl.cpp), beside new's rows above.
for op in ${CP_OPS-gdn kda gla}; do
  [ -n "${SPIN_US:-}" ] && [ "$gpus" -ge 2 ] || break
  KCP_NCCL_SPIN_US=$SPIN_US cp_bench "spin$SPIN_US" $N -x KCP_NCCL_SPIN_US
done
# STAGES=1: one cp-bench per CP_OPS op (new, ranks 1 and 2, one repeat) with KCP_CUDA_STAGE_TIMES=1,
# every rank's forward and backward stage lines in its log: what a rank's local pass runs under CP
# (the kept forward's record reused or the front stages and the recompute again).
for op in ${CP_OPS-gdn kda gla}; do
  [ "${STAGES:-0}" = 1 ] && [ "$gpus" -ge 2 ] || break
  KCP_CUDA_STAGE_TIMES=1 timeout 100 "${mpi[@]}" 2 -x KCP_CUDA_STAGE_TIMES $N cp-bench --backend cuda-chunkwise --comm nccl \
    --keep 1 --variant $op --ranks 1,2 --repeat 2 --T 32768 --H 16 --K 128 --V 128 --dtype bfloat16 > "$L/cps_$op.log" 2>&1
  echo "cp-bench stages $op rc=$? (log cps_$op.log)" >> "$S"
done
# FLA_CP="runs" (carry .fla): scripts/gpu_fla_cp.sh with FLA_CP_RUNS=runs (FLA_CP_OPS, default gdn kda),
# within FLA_CP_LIMIT seconds (240), the summaries of the runs that finished appended, and its dumps
# deleted (a failing check keeps them: kda's always, FLA's ddt_bias; they would push logs.tgz past
# what comes back). kda's first Triton compile takes about 3 minutes on the H200 host (twenty-fifth
# session: its two runs 375 s), more than the default leaves: give it a call of its own, e.g.
# `CP_OPS="" TRANS_OPS="" FLA_CP=... FLA_CP_OPS=kda FLA_CP_LIMIT=480`.
if [ -n "${FLA_CP:-}" ]; then
  FLA_CP_RUNS=$FLA_CP OUT=$L timeout "${FLA_CP_LIMIT:-240}" scripts/gpu_fla_cp.sh $BD > "$L/fla_cp.log" 2>&1
  echo "== FLA CP rc=$? ($(( $(date +%s) - t0 )) s)" >> "$S"; cat "$L"/fla_cp/summary-*.txt >> "$S" 2>/dev/null
  find "$L/fla_cp" -name '*.h5' -delete 2>/dev/null
fi
IFS=, read -ra shapes <<< "${FLA_SHAPES:-}"
for sh in "${shapes[@]}"; do
  IFS=: read -r op T H <<< "$sh"
  for rep in 1 2; do
    timeout 120 $N bench --backend cuda-chunkwise --variant $op --H $H --T $T --backward 1 --keep 1 --check 0 --warmup 2 --repeat 10 > "$L/fb_$op$T.log" 2>&1
    echo "kcp fwd+bwd: $(grep -E "^\| $op" "$L/fb_$op$T.log" | head -1)" >> "$S"
    timeout 60 $N bench --backend cuda-chunkwise --variant $op --H $H --T $T --backward 0 --check 0 --warmup 3 --repeat 20 > "$L/f_$op$T.log" 2>&1
    echo "kcp fwd: $(grep -E "^\| $op" "$L/f_$op$T.log" | head -1)" >> "$S"
  done
done
fla_tables
P=$OUT/prof; mkdir -p "$P"
for x in ${PROFS:-hv_gla:gla:bwd_hv_kernel intra_gla:gla:bwd_intra_kernel}; do
  [ "${PROF:-1}" = 1 ] || break
  IFS=: read -r pn pv pk <<< "$x"
  timeout 100 ncu --set full -k regex:$pk --launch-count 1 -o "$P/$pn" $N bench --backend cuda-chunkwise --variant $pv \
    --H 16 --T 8192 --backward 1 --keep 1 --check 0 --warmup 0 --repeat 1 > "$P/$pn.run.log" 2>&1
  ncu -i "$P/$pn.ncu-rep" > "$P/$pn.details.txt" 2>&1; rm -f "$P/$pn.ncu-rep"
  echo "== ncu $pn: $(grep -E "^    Duration" "$P/$pn.details.txt" | head -1)" >> "$S"
done
echo "done $(( $(date +%s) - t0 )) s" >> "$S"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
[ -d "$P" ] && tar czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$P"
