#!/usr/bin/env bash
# Configures and builds kcp on a GPU machine that has the CUDA toolkit, cmake, ninja, OpenMPI and
# Eigen but no HDF5 or doctest headers (the lent H100): the libraries, the kcp programs without the
# dump commands (io needs HDF5), the CUDA and CP test programs. doctest's header and CMake package
# can be put in .deps/ (copied from a machine that has Debian's doctest-dev):
#   .deps/include/doctest/doctest.h, .deps/lib/cmake/doctest/*.cmake
#   scripts/gpu_build.sh [BUILD_DIR]   default build-gpu/
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -f .deps/lib/cmake/doctest/doctestConfig.cmake ] && args+=(-Ddoctest_DIR="$PWD/.deps/lib/cmake/doctest")
cmake "${args[@]}" > "${OUT:-.}/gpu_configure.log" 2>&1 || { cat "${OUT:-.}/gpu_configure.log"; exit 1; }
grep -E '^-- +\[' "${OUT:-.}/gpu_configure.log" || true
cmake --build "$BUILD" -j "$(nproc)" --target kcp test_cuda test_cuda_backend cp_fault_job
