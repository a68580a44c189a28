#!/usr/bin/env bash
# On a machine with an NVIDIA Hopper GPU: the CUDA test suites, the golden check on cuda-chunkwise
# (when this build has `kcp check`; also with the kept forward, KCP_CUDA_KEEP=1), context parallelism
# on the GPU (cp-sweep over MPI with ranks sharing the GPUs at N = 1..4, over NCCL with one GPU per
# rank, with and without the kept forward, the fault test on both), the
# forward benchmark and cp-bench; a short table last.
#   scripts/gpu.sh [BUILD_DIR]            default build/; binaries built elsewhere work (docs/CUDA.md);
#                                         scripts/gpu_build.sh builds there without HDF5/doctest headers
#   BENCH_ARGS="--T 8192 --H 16" scripts/gpu.sh   extra arguments for `kcp bench`
#   SKIP_TESTS=1 / SKIP_CP=1 / SKIP_BENCH=1 / SKIP_CAPTURE=1   leave a part out
#   (FLA captures: scripts/gpu_capture.sh, run when `import fla` works, e.g. PYTHONPATH=.fla; with
#   2 or more GPUs also FLA's own CP over NCCL at N = 2 (and 4): scripts/gpu_fla_cp.sh)
# Logs go to $OUT when it is set (the device tool's result folder: then packed into logs.tgz beside
# summary.txt at the end), else to gpu-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
[ -d lib ] && export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KCP_SOURCE_DIR=${KCP_SOURCE_DIR:-$PWD}  # data/golden for the golden test case

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null \
  | sed 's/^/device: /' | tee "$LOGS/device.txt"
[ -x "$BUILD/kcp" ] || { echo "gpu.sh: $BUILD/kcp not found (build first, see docs/CUDA.md)"; exit 2; }

summary=()
failed=0
run_suite() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local verdict=passed
  [ $rc -ne 0 ] && verdict="FAILED (rc $rc)" && failed=1
  grep -q "no CUDA device: skipped" "$LOGS/$name.log" && verdict="skipped (no device)"
  echo "$name: $verdict, $((SECONDS - t0)) s"; tail -4 "$LOGS/$name.log"
  summary+=("| $name | $verdict | $((SECONDS - t0)) s |")
}

if [ -z "${SKIP_TESTS:-}" ]; then
  for t in test_cuda_backend test_cuda; do
    exe=$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)
    if [ -n "$exe" ]; then run_suite "$t" "$exe"; else summary+=("| $t | not built | - |"); fi
  done
  if "$BUILD/kcp" help 2>&1 | grep -qE '^  check '; then
    # Every tensor of every file against FLA's results, gradients included (the CUDA backward);
    # what cuda-chunkwise does not support is reported as skipped with the reason.
    run_suite golden_check "$BUILD/kcp" check --backend cuda-chunkwise --precision f32 data/golden
    # the same with the kept forward (every backward after its forward skips the recompute)
    run_suite golden_check_keep env KCP_CUDA_KEEP=1 "$BUILD/kcp" check --backend cuda-chunkwise --precision f32 data/golden
  else
    echo "golden check: this build has no 'kcp check': skipped"
    summary+=("| golden_check | skipped (no kcp check) | - |")
  fi
fi

. scripts/gpu_mpi.sh  # KCP_NCCL_LIBRARY, gpus, mpi (the mpirun prefix), KCP_CUDA_KEEP=0 unless set
fault_job=$(find "$BUILD" -name cp_fault_job -type f -perm -u+x | head -1)
# The fault job must end by itself (non-zero, rank 1's message) well inside the limit.
fault_check() {  # comm ranks (3 under MPI: rank 1 fails while ranks 0 and 2 wait in the exchange)
  local out rc
  out=$(timeout 60 "${mpi[@]}" "$2" "$fault_job" throw cuda-chunkwise "$1" 2>&1); rc=$?
  echo "$out"; echo "fault job: exit code $rc"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "rank 1: error: injected fault"
}
if [ -z "${SKIP_CP:-}" ] && "$BUILD/kcp" help 2>&1 | grep -qE '^  cp-sweep '; then
  for n in 1 2 3 4; do
    run_suite "cp_sweep_mpi_np$n" "${mpi[@]}" "$n" "$BUILD/kcp" cp-sweep --quick --backend cuda-chunkwise --comm mpi
    # the layer rows (kernel on the GPU, docs/LAYER.md) must have run, not only been skipped
    if ! grep -q '^PASS  cuda-chunkwise float32 layer ' "$LOGS/cp_sweep_mpi_np$n.log"; then
      echo "cp_sweep_mpi_np$n: no cuda-chunkwise layer row passed"; failed=1
      summary+=("| cp_sweep_mpi_np$n layer rows | FAILED (none passed) | - |")
    fi
  done
  # the kept forward under CP: forward, backward transition (or the first rank's backward_prepare), backward
  run_suite cp_sweep_mpi_np2_keep env KCP_CUDA_KEEP=1 "${mpi[@]}" 2 "$BUILD/kcp" cp-sweep --backend cuda-chunkwise --comm mpi
  run_suite cp_sweep_nccl_np1 "${mpi[@]}" 1 "$BUILD/kcp" cp-sweep --quick --backend cuda-chunkwise --comm nccl
  if [ "$gpus" -ge 2 ]; then  # one GPU per rank (the multi-GPU run, docs/CP.md)
    for n in 2 4; do
      [ "$gpus" -ge "$n" ] && run_suite "cp_sweep_nccl_np$n" "${mpi[@]}" "$n" "$BUILD/kcp" cp-sweep --backend cuda-chunkwise --comm nccl
      [ "$gpus" -ge "$n" ] && run_suite "cp_sweep_nccl_np${n}_keep" env KCP_CUDA_KEEP=1 "${mpi[@]}" "$n" "$BUILD/kcp" cp-sweep --backend cuda-chunkwise --comm nccl
    done
  fi
  # More ranks than GPUs under NCCL: one clear line and exit 2 before any computation.
  nccl_refusal() {
    local out rc
    out=$(timeout 60 "${mpi[@]}" $((gpus + 1)) "$BUILD/kcp" cp-sweep --quick --backend cuda-chunkwise --comm nccl 2>&1); rc=$?
    echo "$out" | tail -3
    [ $rc -eq 2 ] && echo "$out" | grep -q "NCCL needs one GPU per rank"
  }
  run_suite cp_nccl_refused_np$((gpus + 1)) nccl_refusal
  if [ -n "$fault_job" ]; then
    run_suite cp_fault_mpi fault_check mpi 3
    [ "$gpus" -ge 2 ] && run_suite cp_fault_nccl fault_check nccl 2
  fi
fi

# Real FLA captures (issue 13) when FLA is importable: scripts/gpu_capture.sh.
if [ -z "${SKIP_CAPTURE:-}" ] && python3 -c "import fla" 2>/dev/null; then
  run_suite fla_capture scripts/gpu_capture.sh "$LOGS/captures" "$BUILD"
  # FLA's own CP judged by kcp (issue 14 item 3): one GPU per rank over NCCL where the GPUs exist
  # (scripts/gpu_fla_cp.sh alone runs 1 rank over NCCL and 2 ranks sharing a GPU over gloo).
  if [ "$gpus" -ge 2 ]; then
    # (4 ranks also with 1022,4,1020,4,1020,4,1022: every cut inside a 4-token sequence, so each rank's
    # transitions cover 2 tokens and M stays far from 0)
    fla_cp_runs="2:nccl"; [ "$gpus" -ge 4 ] && fla_cp_runs="2:nccl 4:nccl 4:nccl::1022,4,1020,4,1020,4,1022"
    run_suite fla_cp_nccl env FLA_CP_RUNS="$fla_cp_runs" OUT="$LOGS" scripts/gpu_fla_cp.sh "$BUILD"
  fi
fi

bench_table=""
if [ -z "${SKIP_BENCH:-}" ]; then
  # shellcheck disable=SC2086
  "$BUILD/kcp" bench --backend cuda-chunkwise ${BENCH_ARGS:-} 2>&1 | tee "$LOGS/bench.log"
  bench_table=$(sed -n '/^| op /,$p' "$LOGS/bench.log")
  if "$BUILD/kcp" help 2>&1 | grep -qE '^  cp-bench '; then  # ranks share the GPU(s) over MPI
    # The issue's geometry: T = 32768 per rank, H = 16, K = V = 128, bf16 (ranks share the GPU).
    "${mpi[@]}" 4 "$BUILD/kcp" cp-bench --backend cuda-chunkwise --comm mpi --ranks 1,2,4 \
      --T 32768 --H 16 --K 128 --V 128 --dtype bfloat16 ${CP_BENCH_ARGS:-} 2>&1 \
      | tee "$LOGS/cp_bench.log"
    # One GPU per rank over NCCL (issue 14 item 2: the CP phases against the local pass at N = 2, 4):
    # ranks 1, 2, 4 as far as the GPUs go; no host round trip in the exchange.
    nccl_ranks=1; [ "$gpus" -ge 2 ] && nccl_ranks=1,2; [ "$gpus" -ge 4 ] && nccl_ranks=1,2,4
    "${mpi[@]}" "${nccl_ranks##*,}" "$BUILD/kcp" cp-bench --backend cuda-chunkwise --comm nccl --ranks "$nccl_ranks" \
      --repeat 3 --T 32768 --H 16 --K 128 --V 128 --dtype bfloat16 ${CP_BENCH_ARGS:-} 2>&1 | tee "$LOGS/cp_bench_nccl.log"
  fi
fi

{
  echo
  echo "| suite | result | time |"
  echo "|---|---|---|"
  printf '%s\n' "${summary[@]}"
  [ -n "$bench_table" ] && { echo; echo "$bench_table"; }
} | tee "$LOGS/summary.txt"
# The device tool returns a few files of $OUT only: there, the logs go back as one archive.
if [ -n "${OUT:-}" ]; then
  (cd "$LOGS" && find . -type f ! -name summary.txt ! -name logs.tgz | tar czf logs.tgz -T - \
    && find . -type f ! -name summary.txt ! -name logs.tgz -delete && find . -mindepth 1 -type d -empty -delete)
fi
exit $failed
