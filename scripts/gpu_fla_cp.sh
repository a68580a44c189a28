#!/usr/bin/env bash
# FLA's own context parallelism judged by kcp (issue 14 item 3, docs/CP.md "FLA's own CP"): for gdn
# and kda, scripts/fla_cp_capture.py runs FLA's chunk_* with build_cp_context's context on every rank,
# captures each rank's call, then `kcp assemble` + `kcp check` (FLA's thresholds, every tensor), and
# `kcp check` of the rank files: FLA's per-rank transitions against the oracle's (rows debug cp_transition_*).
#   scripts/gpu_fla_cp.sh [BUILD_DIR]       default build-gpu/; needs torch, triton and FLA (.fla/)
#   FLA_CP_RUNS="1:nccl 2:gloo 2:gloo::2046,4,2046"  (default)  ranks:backend[:staging[:seqlens]];
#                                           nccl = one GPU per rank, gloo = ranks share the GPU (exchange
#                                           staged through the host); seqlens replaces the default lengths:
#                                           2046,4,2046 cuts a 4-token sequence in the middle at P = 2, so
#                                           FLA's transitions cover 2 tokens and M stays far from 0 (on the
#                                           default lengths the pieces are hundreds of tokens and M decays
#                                           to ~0, passing by the absolute rule); scripts/gpu.sh passes
#                                           "2:nccl 4:nccl" where the GPUs exist
#   FLA_CP_OPS="gdn kda" FLA_CP_DTYPES="bf16" FLA_CP_ARGS="--H 4 --K 128 --V 128"
#   FLA_CP_PROBE=1       also 2 ranks over gloo with FLA's own all_gather_into_tensor (no staging)
#   KEEP_DUMPS=1         keep the .h5 files after a successful check (they are large)
# The ops run in parallel (Triton's cold compile is CPU-bound), each op's runs in sequence; logs,
# check JSON and a summary go to $OUT/fla_cp (else gpu-logs/fla_cp). Where this kcp has no `check`
# (built without HDF5) the rank files stay there: `scripts/fla_cp_capture.py --judge DIR --kcp kcp`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUILD=${1:-build-gpu}
LOGS=${OUT:-gpu-logs}/fla_cp
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 KCP_FLA_MAX_CONFIGS=${KCP_FLA_MAX_CONFIGS:-1} PYTHONPATH="$PWD/.fla${PYTHONPATH:+:$PYTHONPATH}"
. scripts/gpu_env.sh  # LD_LIBRARY_PATH (.deps HDF5, lib/), KCP_SOURCE_DIR
if ! python3 -c "import torch, triton, fla" 2>/dev/null; then
  echo "gpu_fla_cp: FLA (or torch/triton) not importable: skipped"; exit 0
fi
judge=()
if [ -x "$BUILD/kcp" ] && "$BUILD/kcp" help 2>&1 | grep -qE '^  assemble '; then
  judge=(--kcp "$BUILD/kcp")
else
  echo "gpu_fla_cp: $BUILD/kcp has no 'assemble' (no HDF5): files kept for --judge elsewhere"
fi
runs=${FLA_CP_RUNS:-1:nccl 2:gloo 2:gloo::2046,4,2046}
[ -n "${FLA_CP_PROBE:-}" ] && runs="$runs 2:gloo:off"

one_op() {  # op: every run of FLA_CP_RUNS x FLA_CP_DTYPES in sequence, a line each in summary-<op>.txt
  local op=$1 dtype spec n backend staging lens dir rc
  for dtype in ${FLA_CP_DTYPES:-bf16}; do
    for spec in $runs; do
      IFS=: read -r n backend staging lens <<< "$spec"
      dir="$LOGS/${op}_${dtype}_P${n}_${backend}${staging:+_staging-$staging}${lens:+_lens-${lens//,/-}}"
      mkdir -p "$dir"
      # shellcheck disable=SC2086
      timeout "${FLA_CP_TIMEOUT:-540}" python3 scripts/fla_cp_capture.py --op "$op" --dtype "$dtype" \
        --nproc "$n" --backend "$backend" --gloo-staging "${staging:-auto}" --out "$dir" "${judge[@]}" \
        ${lens:+--seqlens "$lens"} ${FLA_CP_ARGS:-} > "$dir/run.log" 2>&1
      rc=$?
      echo "$op $dtype P=$n $backend${staging:+ staging=$staging}${lens:+ seqlens=$lens}: exit $rc ($dir/run.log)" \
        | tee -a "$LOGS/summary-$op.txt"
      # per file (== line): the fla_chunk rows, and FLA's per-rank transitions (debug cp_transition_*) of
      # the rank files against the oracle's (validation/cp_transition_check.h)
      grep -E '^(rank |kcp (assemble|check):|== |  fla_chunk |  debug +cp_transition)' "$dir/run.log" \
        | tee -a "$LOGS/summary-$op.txt"
      if [ $rc -eq 0 ] && [ ${#judge[@]} -gt 0 ] && [ -z "${KEEP_DUMPS:-}" ]; then rm -f "$dir"/*.h5; fi
    done
  done
}

rm -f "$LOGS"/summary-*.txt
for op in ${FLA_CP_OPS:-gdn kda}; do one_op "$op" & done
wait
cat "$LOGS"/summary-*.txt > "$LOGS/summary.txt"
echo "== gpu_fla_cp summary"; cat "$LOGS/summary.txt"
! grep -qE ': exit [1-9]' "$LOGS/summary.txt"
