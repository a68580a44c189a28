# Sourced by the same-call A/B scripts (scripts/gpu_ab.sh, scripts/gpu_cp_ab.sh; repository root, with S
# the summary file and L the log folder set): the working tree and a base tree (BASE_TGZ, default
# .gpu/base.tgz, from `git archive --prefix=base/`) configured with .deps' doctest and HDF5
# (scripts/gpu_deps.sh) and built side by side, half the cores each; their exit codes into the summary.
#   ab_build "kcp test_cuda"     the new tree's targets (the base builds kcp); then build-gpu/kcp and
#                                /tmp/b/build/kcp. Returns when both builds have ended.
#   ab_unpack "kcp_base test_cuda"  PREBUILT=1 instead: .gpu.tgz (scripts/gpu_pack.sh, built here)
#                                unpacked into .gpu/, its libraries on LD_LIBRARY_PATH; .gpu/kcp and
#                                the named binaries must be there, else a summary line and status 1.
ab_cfg() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -Ddoctest_DIR="$PWD/.deps/lib/cmake/doctest" \
    -DHDF5_ROOT="$PWD/.deps/hdf5" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON -DCMAKE_CUDA_FLAGS=
}
ab_build() {
  local jobs=$(( $(nproc) / 2 )) bn
  # Both trees from scratch: a machine kept warm between calls keeps build-gpu/ and /tmp/b, and the
  # copied sources' times need not be newer than those objects (seen: a stale dhu_local object in
  # the new tree and a base not rebuilt at all, fifteenth session).
  rm -rf /tmp/b build-gpu
  mkdir -p /tmp/b && tar xzf "${BASE_TGZ:-.gpu/base.tgz}" -C /tmp/b
  # shellcheck disable=SC2086  # $1: a list of targets
  ( ab_cfg . build-gpu > "$L/cfg_new.log" 2>&1 && cmake --build build-gpu -j $jobs --target $1 > "$L/build_new.log" 2>&1
    echo "new build rc=$?" >> "$S" ) &
  bn=$!
  ( ab_cfg /tmp/b/base /tmp/b/build > "$L/cfg_base.log" 2>&1 && cmake --build /tmp/b/build -j $jobs --target kcp > "$L/build_base.log" 2>&1
    echo "base build rc=$?" >> "$S" ) &
  wait $bn $!
}
ab_unpack() {
  # Afresh: a machine kept warm keeps .gpu/ between calls, and a binary of an earlier pack (kcp_alt)
  # would be timed again.
  [ -f .gpu.tgz ] && rm -rf .gpu && tar xzf .gpu.tgz
  export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-} KCP_SOURCE_DIR=$PWD
  local b
  for b in kcp $1; do
    [ -x ".gpu/$b" ] || { echo "PREBUILT: .gpu/$b expected (scripts/gpu_pack.sh)" >> "$S"; return 1; }
  done
}
