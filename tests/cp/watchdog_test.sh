#!/bin/sh
# Runs cp_fault_job in "stop" mode at 3 ranks: rank 1 stops itself (SIGSTOP) before the exchange
# while ranks 0 and 2 wait in the all-gather. With KCP_CP_TIMEOUT=3 their watchdog must end the job
# within 3 s + a margin; passes only if the job ends by itself with a non-zero exit code and the
# watchdog's message. Usage: watchdog_test.sh MPIEXEC JOB
mpiexec="$1"
job="$2"
start=$(date +%s)
out=$(KCP_CP_TIMEOUT=3 timeout 60 "$mpiexec" --oversubscribe -x KCP_CP_TIMEOUT -np 3 "$job" stop 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
echo "watchdog_test: exit code $rc after ${elapsed} s"
if [ "$rc" -eq 124 ]; then echo "watchdog_test: FAIL, the job hung (killed after 60 s)"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "watchdog_test: FAIL, the job exited 0 despite a stopped rank"; exit 1; fi
if ! echo "$out" | grep -q "has waited .* another rank stopped answering"; then
  echo "watchdog_test: FAIL, the watchdog's message is missing"; exit 1
fi
if [ "$elapsed" -gt 20 ]; then echo "watchdog_test: FAIL, took ${elapsed} s (limit 3 s + start-up)"; exit 1; fi
echo "watchdog_test: PASS, the job ended ${elapsed} s after start with the watchdog's message"
