#!/bin/sh
# Bad communicator choices end cp-sweep with exit 2 and one line naming the problem, before any
# computation: --comm nccl for a host backend, an unknown --comm. (The GPU-only refusal, --comm nccl
# with more ranks than GPUs, runs in scripts/gpu.sh.) Usage: comm_refusal_test.sh MPIEXEC KCP
mpiexec="$1"
kcp="$2"
fail=0
expect() {  # name, expected text, command...
  name=$1 text=$2; shift 2
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  lines=$(printf '%s\n' "$out" | grep -c 'error')
  if [ "$rc" -eq 2 ] && printf '%s' "$out" | grep -qF -- "$text" && [ "$lines" -ge 1 ]; then
    echo "PASS $name: exit 2, '$text'"
  else
    echo "FAIL $name: exit $rc, expected 2 and '$text'; output:"; printf '%s\n' "$out"; fail=1
  fi
}
expect nccl_on_host "--comm nccl: the backend computes on the host" \
  "$mpiexec" --oversubscribe -np 1 "$kcp" cp-sweep --quick --backend cpu-chunkwise --comm nccl
expect nccl_on_host_np2 "--comm nccl: the backend computes on the host" \
  "$mpiexec" --oversubscribe -np 2 "$kcp" cp-sweep --quick --backend cpu-chunkwise --comm nccl
expect unknown_comm "--comm: expected auto, mpi or nccl, got 'tcp'" \
  "$mpiexec" --oversubscribe -np 1 "$kcp" cp-sweep --quick --comm tcp
exit $fail
