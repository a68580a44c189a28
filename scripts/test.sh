#!/usr/bin/env bash
# README's test command: setup, build, and the whole test suite through ctest; then (full runs only)
# the io, validation and cp labels again under AddressSanitizer + UBSan in build-asan
# (scripts/sanitize.sh; KCP_SANITIZE=0 skips it). Extra arguments go to ctest (e.g. scripts/test.sh
# -L reference) and skip the sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 1800 "$@"
if [ $# -eq 0 ] && [ "${KCP_SANITIZE:-1}" != 0 ]; then
  # cp_sweep_full_np4 (the whole layout matrix) takes minutes under ASan; the quick sweeps at 1-4
  # ranks run the same code
  scripts/sanitize.sh -L 'io|validation|cp' -E cp_sweep_full_np4
fi
