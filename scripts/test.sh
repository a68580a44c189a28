#!/usr/bin/env bash
# README's test command: setup, build, and the whole test suite through ctest.
# Extra arguments go to ctest (e.g. scripts/test.sh -L reference).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 1800 "$@"
