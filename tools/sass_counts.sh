#!/usr/bin/env bash
# Static SASS of one CUDA source, on this (GPU-less) machine: compiles cuda/<file>.cu to a cubin with
# the build's own flags, disassembles it, and prints per kernel the instruction count and the counts
# of a few classes (R2UR: a value moved into a uniform register, e.g. a wgmma descriptor ptxas kept in
# ordinary registers; HGMMA / HMMA tensor-core instructions; LDS / LDSM shared loads; F2FP conversions).
# What it is for: checking a code change's effect on a kernel's instructions before a GPU call
# (ncu on the GPU gives the dynamic counts; docs/CUDA.md "Profiling").
#   tools/sass_counts.sh <build dir> cuda/chunk_state_fold.cu [out prefix] [kernel regex]
# Writes <out>.sass (the whole disassembly). Needs an nvdisasm: $NVDISASM, or one on PATH. The CUDA
# 13 toolkit here has none; Debian's (package nvidia-cuda-toolkit 11.8, component non-free) does:
#   apt-get download nvidia-cuda-toolkit && dpkg -x nvidia-cuda-toolkit_*.deb /opt/cu118
#   NVDISASM=/opt/cu118/usr/bin/nvdisasm tools/sass_counts.sh build cuda/chunk_bwd_hv.cu
# That nvdisasm reads only the older cubin header (ELF ABI version 7, sm in the low byte of e_flags);
# the copy it reads gets that header (the code is unchanged; sm_90 is the only target we build).
set -euo pipefail
build=$1 src=$2 out=${3:-/tmp/sass_$(basename "$src" .cu)} pick=${4:-.}
nvd=${NVDISASM:-$(command -v nvdisasm || true)}
[ -n "$nvd" ] || { sed -n 9,13p "$0" >&2; exit 2; }
obj="cuda/CMakeFiles/kcp_cuda.dir/$(basename "$src").o"
cmd=$(cd "$build" && ninja -t commands "$obj" | tail -1)
[ -n "$cmd" ] || { echo "no compile command for $obj in $build" >&2; exit 2; }
# The object's command with -cubin for -c and no dependency file.
cmd=$(echo "$cmd" | sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -c / -cubin /; s/ -o [^ ]+/ -o '"${out//\//\\/}"'.cubin/; s/--generate-code=arch=compute_90a,code=\[compute_90a,sm_90a\]/-arch=sm_90a/')
(cd "$build" && eval "$cmd")
python3 - "$out" <<'PY'
import struct, sys
o = sys.argv[1]
b = bytearray(open(o + '.cubin', 'rb').read())
if b[8] > 7:  # EI_ABIVERSION 8 (CUDA 13): rewrite to version 7, e_flags = sm_90 | virtual sm_90 | 64-bit
    b[8] = 7
    struct.pack_into('<I', b, 48, 0x005a055a)
open(o + '.old.cubin', 'wb').write(b)
PY
"$nvd" -c "$out.old.cubin" > "$out.sass"
awk -v pick="$pick" '
  /^\/\/--------------------- \.text/ { name = $2; sub(/^\.text\./, "", name) }
  /^ +\/\*[0-9a-f]+\*\// && name ~ pick {
    n[name]++
    if ($0 ~ /R2UR/) r[name]++
    if ($0 ~ /HGMMA/) g[name]++
    if ($0 ~ / HMMA/) m[name]++
    if ($0 ~ / LDS(M)?[. ]/) l[name]++
    if ($0 ~ /F2FP/) f[name]++
  }
  END { printf "%7s %5s %5s %5s %5s %5s  kernel\n", "instr", "R2UR", "HGMMA", "HMMA", "LDS", "F2FP"
        for (k in n) printf "%7d %5d %5d %5d %5d %5d  %s\n", n[k], r[k], g[k], m[k], l[k], f[k], k }' "$out.sass" |
  sed -E 's/_ZN3kcp4cuda[0-9]+_GLOBAL__N__[0-9a-f]+_[0-9]+_[a-z0-9_]+_cu_[0-9a-f]+[0-9]+//'
