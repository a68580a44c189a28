#!/usr/bin/env bash
# README's main command: setup, build, then the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build/kcp bench-oracle --T 2048
