#!/usr/bin/env bash
# Nsight Compute's throughput, memory and warp-state sections of one kernel (its first launch in a
# single-call bench run) for each build packed by scripts/gpu_pack.sh (.gpu/kcp, and .gpu/kcp_alt and
# .gpu/kcp_base where packed), at the GPU's own clocks: where a kernel's time goes (L2 / DRAM throughput
# against their peaks, the issue rate, the stall reasons) before and after a change. The full reports
# go to $OUT/ncu_<build>_<kernel>.txt, the key lines to $OUT/ncu_sections.txt.
# There (after `tar xzf .gpu.tgz`): OUT=... KERNELS="bwd_dhu chunk_state_fold" [ARGS="..."] scripts/gpu_ncu_sections.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
ARGS=${ARGS:---variant gdn --H 16 --T 8192 --backward 1 --keep 1}
read -r -a A <<< "$ARGS"
B=(bench --backend cuda-chunkwise --dtype bfloat16 --check 0 "${A[@]}" --warmup 0 --repeat 1)
S=$OUT/ncu_sections.txt
KEYS='Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Hit Rate|L2 Hit Rate|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued Instruction|No Eligible|Registers Per Thread|Stall|stall'
for build in kcp kcp_alt kcp_base; do
  [ -x .gpu/$build ] || continue
  for k in ${KERNELS:-bwd_dhu}; do
    f=$OUT/ncu_${build}_$k.txt
    timeout 150 ncu --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section LaunchStats .gpu/$build "${B[@]}" > "$f" 2>&1
    { echo "== $build $k"; grep -E "  [a-z_:]+<|$KEYS" "$f" | head -40; } >> "$S"
  done
done
cat "$S"
