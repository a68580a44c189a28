#!/usr/bin/env bash
# Packs the binaries of a build made here (with HDF5, so `kcp check` is in) and the shared libraries
# the GPU machine lacks into .gpu/ (git-ignored), to be carried to a GPU machine that has the CUDA
# driver, OpenMPI and glibc but no HDF5 (the lent H100, docs/CUDA.md), and as .gpu.tgz (about 19 MiB:
# the device code compresses well; carry limits count bytes). There:
#   tar xzf .gpu.tgz && LD_LIBRARY_PATH=$PWD/.gpu/lib scripts/gpu.sh .gpu
#   [BINS="kcp tests/cuda/test_cuda"] [BASE_KCP=path] [ALT_KCP=path] scripts/gpu_pack.sh [BUILD_DIR]
# BASE_KCP: a base build's kcp, stripped into .gpu/kcp_base (scripts/gpu_ab.sh PREBUILT=1); ALT_KCP:
# a second candidate's kcp into .gpu/kcp_alt (timed as column "alt" beside new and base).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
rm -rf .gpu && mkdir -p .gpu/lib
# Named by path: the build tree holds other copies (the install test's prefix/bin/kcp).
for f in ${BINS:-kcp tests/cuda/test_cuda tests/cuda/test_cuda_backend tests/cp/cp_fault_job}; do
  [ -x "$BUILD/$f" ] || { echo "gpu_pack: $BUILD/$f not built" >&2; exit 1; }
  strip -o ".gpu/$(basename "$f")" "$BUILD/$f"
done
for lib in libgomp.so.1 libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .gpu/lib/
done
[ -n "${BASE_KCP:-}" ] && strip -o .gpu/kcp_base "$BASE_KCP"
[ -n "${ALT_KCP:-}" ] && strip -o .gpu/kcp_alt "$ALT_KCP"
tar czf .gpu.tgz .gpu
du -sh .gpu .gpu.tgz
