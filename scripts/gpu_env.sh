# Sourced by the GPU check scripts (from the repository root): the run-time environment of binaries
# built by scripts/gpu_build.sh on the GPU machine: HDF5 from .deps (scripts/gpu_deps.sh), libraries
# of a carried pack in lib/ (scripts/gpu_pack.sh), and KCP_SOURCE_DIR for the tests that read data/.
[ -d lib ] && export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d .deps/hdf5/lib ] && export LD_LIBRARY_PATH="$PWD/.deps/hdf5/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KCP_SOURCE_DIR=${KCP_SOURCE_DIR:-$PWD}
