#!/usr/bin/env bash
# Longer fuzz runs of the dump reader: scripts/fuzz.sh MINUTES [SEED] [BUILD_DIR]
# Builds kcp_fuzz (tests/fuzz/fuzz_dumps.cpp) in BUILD_DIR (default build; use build-asan from
# scripts/sanitize.sh for AddressSanitizer + UBSan) and runs it for MINUTES. Findings (signal, hang,
# sanitizer report, memory over the bound) are kept in BUILD_DIR/fuzz-findings with the reason; copy
# them to tests/fuzz/regressions/ once fixed. Prints inputs tried, exits, contained crashes, peak RSS.
#   scripts/fuzz.sh --libfuzzer MINUTES   also builds and runs the clang libFuzzer target
#                                         (tests/fuzz/libfuzzer_dump.cpp) in build-libfuzzer
set -euo pipefail
cd "$(dirname "$0")/.."
libfuzzer=0
if [ "${1:-}" = "--libfuzzer" ]; then libfuzzer=1; shift; fi
minutes=${1:?usage: scripts/fuzz.sh [--libfuzzer] MINUTES [SEED] [BUILD_DIR]}
seed=${2:-$(date +%s)}
dir=${3:-build}
[ -f "$dir/CMakeCache.txt" ] || scripts/setup.sh
cmake --build "$dir" -j "$(nproc)" --target kcp_fuzz
KCP_SOURCE_DIR=$PWD "$dir/tests/fuzz/kcp_fuzz" --seconds "$((minutes * 60))" --seed "$seed" --mem-mb 2048 \
  --timeout-s 20 --keep "$dir/fuzz-findings"
if [ "$libfuzzer" = 1 ]; then
  command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found"; exit 2; }
  hdf5_inc=$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
  hdf5_lib=$(pkg-config --libs hdf5 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
  mkdir -p build-libfuzzer/corpus
  cp data/golden/*.h5 build-libfuzzer/corpus/
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. $hdf5_inc tests/fuzz/libfuzzer_dump.cpp \
    io/*.cpp core/*.cpp -o build-libfuzzer/libfuzzer_dump $hdf5_lib
  # -detect_leaks=0: libhdf5 1.10 leaks on some error paths of corrupt files (its frames only)
  build-libfuzzer/libfuzzer_dump -max_total_time="$((minutes * 60))" -rss_limit_mb=2048 -timeout=20 -detect_leaks=0 \
    -artifact_prefix=build-libfuzzer/ build-libfuzzer/corpus
fi
