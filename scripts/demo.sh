#!/usr/bin/env bash
# README's main command: setup, build, then the main job: the float64 oracle against FLA's golden
# dumps (docs/GOLDEN.md explains every row), then a short oracle benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build/kcp check data/golden
build/kcp bench-oracle --T 2048
