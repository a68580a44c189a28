#!/bin/sh
# Runs cp_fault_job at 3 ranks (rank 1 throws while ranks 0 and 2 wait in the all-gather) and
# passes only if the job ends by itself within the limit, with a non-zero exit code and rank 1's
# message. Usage: fault_test.sh MPIEXEC JOB
mpiexec="$1"
job="$2"
out=$(timeout 60 "$mpiexec" --oversubscribe -np 3 "$job" 2>&1)
rc=$?
echo "$out"
echo "fault_test: exit code $rc"
if [ "$rc" -eq 124 ]; then echo "fault_test: FAIL, the job hung (killed after 60 s)"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "fault_test: FAIL, the job exited 0 despite the fault"; exit 1; fi
if ! echo "$out" | grep -q "cp_fault_job: rank 1: error: injected fault in transition_forward"; then
  echo "fault_test: FAIL, rank 1's message is missing"; exit 1
fi
echo "fault_test: PASS, the job aborted with rank 1's message"
