#!/usr/bin/env bash
# setup (dependencies + configure) then build everything in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
cmake --build build -j "$(nproc)"
