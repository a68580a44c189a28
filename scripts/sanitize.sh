#!/usr/bin/env bash
# One command for the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build
# folder (build-asan, CUDA off): configure, build, then ctest. Any sanitizer report fails the test
# that triggered it (-fno-sanitize-recover, halt_on_error).
#   scripts/sanitize.sh                   the whole CPU suite (every label)
#   scripts/sanitize.sh -L 'io|validation|cp'   only those labels, and only their targets are built
# Extra arguments go to ctest. KCP_SANITIZE_BUILD=DIR picks another build folder.
# HDF5, OpenMPI and Eigen are not instrumented. Leak checks are off by default (OpenMPI's and
# HDF5's process-lifetime allocations); test_io_asan turns them on for the io code.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KCP_SANITIZE_BUILD:-build-asan}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DKCP_ENABLE_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
fi
targets=()
case " $* " in  # the labels CI runs: build only what their tests need
  *"io|validation|cp"*) targets=(--target kcp test_io test_io_asan test_cli test_validation test_isolate kcp_fuzz);
    if grep -q "^MPIEXEC_EXECUTABLE:FILEPATH=/" "$dir/CMakeCache.txt"; then
      targets+=(test_cp test_cp_mpi cp_fault_job); fi ;;
esac
start=$(date +%s)
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
echo "sanitize: build took $(( $(date +%s) - start )) s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
start=$(date +%s)
ctest --test-dir "$dir" --output-on-failure --timeout 1800 "$@"
echo "sanitize: tests took $(( $(date +%s) - start )) s"
