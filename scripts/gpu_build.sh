#!/usr/bin/env bash
# Configures and builds kcp on a GPU machine that has the CUDA toolkit, cmake, ninja, OpenMPI and
# Eigen but no HDF5 or doctest headers (the lent H100): the libraries, the kcp programs, the CUDA and
# CP test programs. Without HDF5 the dump commands (io) and the golden GPU tests are left out; with
# .deps/ filled by scripts/gpu_deps.sh on a Debian machine (doctest, HDF5 headers and library) and
# carried, everything is built (then run with LD_LIBRARY_PATH=$PWD/.deps/hdf5/lib).
#   scripts/gpu_build.sh [BUILD_DIR]   default build-gpu/
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -f .deps/lib/cmake/doctest/doctestConfig.cmake ] && args+=(-Ddoctest_DIR="$PWD/.deps/lib/cmake/doctest")
if [ -f .deps/hdf5/include/hdf5.h ]; then
  [ -e .deps/hdf5/lib/libhdf5.so ] || ln -s libhdf5_serial.so.103 .deps/hdf5/lib/libhdf5.so  # if a copy lost the link
  args+=(-DHDF5_ROOT="$PWD/.deps/hdf5" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON)
  export LD_LIBRARY_PATH="$PWD/.deps/hdf5/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libsz, libaec at link time
fi
cmake "${args[@]}" > "${OUT:-.}/gpu_configure.log" 2>&1 || { cat "${OUT:-.}/gpu_configure.log"; exit 1; }
grep -E '^-- +\[' "${OUT:-.}/gpu_configure.log" || true
cmake --build "$BUILD" -j "$(nproc)" --target kcp test_cuda test_cuda_backend cp_fault_job
