# Sourced (from the repository root) by the GPU scripts that run a carried pack (scripts/gpu_pack.sh:
# .gpu.tgz, unpacked here into .gpu/ once): OUT (default gpu-logs) with its logs/ folder, the summary
# file S and the log folder L, and the pack's run-time environment (its libraries, KCP_SOURCE_DIR).
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT/logs"
S=$OUT/summary.txt; L=$OUT/logs
[ -f .gpu.tgz ] && [ ! -x .gpu/kcp ] && tar xzf .gpu.tgz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-} KCP_SOURCE_DIR=$PWD
