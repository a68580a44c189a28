#!/usr/bin/env bash
# Same-call A/B of context parallelism on a machine with several GPUs (issue 14; docs/CP.md): the
# working tree ("new") and a base tree built side by side there, then on new: the CUDA keep and
# transition test cases, the NCCL cp-sweep (one GPU per rank: N = 2 quick, N = 4 full with and without
# the kept forward), the NCCL fault job, one small NCCL run with NCCL_DEBUG=INFO (which transport the
# exchange takes); then cp-bench over NCCL, new and base alternating, gdn and kda, kept forward,
# T = 32768 per rank, H = 16, K = V = 128, bf16, ranks 1, 2, 4 as far as the GPUs go. Summary in
# $OUT/summary.txt, logs in $OUT/logs.tgz. About 6-9 minutes on 4 GPUs.
# Here, before the call (.gpu/ and .deps/ are git-ignored; carry both):
#   git archive --prefix=base/ <commit> -- . ':!data' ':!docs' | gzip > .gpu/base.tgz; scripts/gpu_deps.sh
# There:  [CP_OPS="gdn kda"] [CP_REPEAT=3] scripts/gpu_cp_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
S=$OUT/summary.txt; L=$OUT/logs; mkdir -p "$L"
date > "$S"; nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c >> "$S"
nvidia-smi topo -m > "$L/topo.txt" 2>&1
export LD_LIBRARY_PATH=$PWD/.deps/hdf5/lib:${LD_LIBRARY_PATH:-}
. scripts/gpu_mpi.sh  # KCP_NCCL_LIBRARY, gpus, mpi
ROOT=$PWD; t0=$(date +%s)
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -Ddoctest_DIR="$ROOT/.deps/lib/cmake/doctest" -DHDF5_ROOT="$ROOT/.deps/hdf5" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON -DCMAKE_CUDA_FLAGS=; }
mkdir -p /tmp/b && tar xzf "${BASE_TGZ:-.gpu/base.tgz}" -C /tmp/b
jobs=$(( $(nproc) / 2 ))
( cfg . build-gpu > "$L/cfg_new.log" 2>&1 && cmake --build build-gpu -j $jobs --target kcp test_cuda cp_fault_job > "$L/build_new.log" 2>&1; echo "new build rc=$?" >> "$S" ) &
bn=$!
( cfg /tmp/b/base /tmp/b/build > "$L/cfg_base.log" 2>&1 && cmake --build /tmp/b/build -j $jobs --target kcp > "$L/build_base.log" 2>&1; echo "base build rc=$?" >> "$S" ) &
wait $bn $!
echo "builds $(( $(date +%s) - t0 )) s, $gpus GPUs" >> "$S"
N=build-gpu/kcp; B=/tmp/b/build/kcp
[ -x $N ] && [ -x $B ] || { tail -30 "$L/build_new.log" "$L/build_base.log" >> "$S"; exit 1; }
step() {  # name, command...: its exit code and last line into the summary
  local name=$1; shift
  timeout 300 "$@" > "$L/$name.log" 2>&1
  echo "$name rc=$? ($(( $(date +%s) - t0 )) s): $(grep -v '^\s*$' "$L/$name.log" | tail -1)" >> "$S"
}
TC=$(find build-gpu -name test_cuda -type f -perm -u+x | head -1)
step test_cuda_keep_transition "$TC" -tc="*kept forward*,*transition*"
grep -E "test cases:|assertions:" "$L/test_cuda_keep_transition.log" >> "$S"
if [ "$gpus" -ge 2 ]; then
  step cp_sweep_nccl_np2_quick_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 2 $N cp-sweep --quick --backend cuda-chunkwise --comm nccl
  NCCL_DEBUG=INFO step nccl_transport "${mpi[@]}" 2 $N cp-sweep --quick --backend cuda-chunkwise --comm nccl --filter gdn
  grep -hoE "via (P2P|SHM|NET|IPC)[^ ]*( [A-Za-z/]+)?" "$L/nccl_transport.log" | sort | uniq -c | head -5 >> "$S"
  fault=$(find build-gpu -name cp_fault_job -type f -perm -u+x | head -1)
  step cp_fault_nccl "${mpi[@]}" 2 "$fault" throw cuda-chunkwise nccl
fi
if [ "$gpus" -ge 4 ]; then
  step cp_sweep_nccl_np4 "${mpi[@]}" 4 $N cp-sweep --backend cuda-chunkwise --comm nccl
  step cp_sweep_nccl_np4_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 4 $N cp-sweep --backend cuda-chunkwise --comm nccl
fi
ranks=1; [ "$gpus" -ge 2 ] && ranks=1,2; [ "$gpus" -ge 4 ] && ranks=1,2,4
for op in ${CP_OPS:-gdn kda}; do
  for tag in new base; do
    X=$N; [ $tag = base ] && X=$B
    timeout 200 "${mpi[@]}" "${ranks##*,}" $X cp-bench --backend cuda-chunkwise --comm nccl --keep 1 --variant $op \
      --ranks $ranks --repeat "${CP_REPEAT:-3}" --T 32768 --H 16 --K 128 --V 128 --dtype bfloat16 > "$L/cpb_${op}_$tag.log" 2>&1
    echo "== cp-bench $op $tag rc=$?" >> "$S"; grep -E "^ +[0-9]+ +[0-9]+ \|" "$L/cpb_${op}_$tag.log" >> "$S"
  done
done
echo "done $(( $(date +%s) - t0 )) s" >> "$S"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
