#!/usr/bin/env bash
# Installs whatever kcp's build needs that is missing (Debian/Ubuntu, apt-get; idempotent) and
# configures a Release build in build/. Safe to run again: it only installs what is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build libeigen3-dev libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          doctest-dev python3 python3-h5py python3-numpy python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif (($#)); then
  cmake -S . -B build "$@"
fi
