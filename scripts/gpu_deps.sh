#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with what the lent GPU machine lacks to configure and build all of kcp
# there, taken from this Debian machine (scripts/setup.sh installs them): doctest's header and CMake
# package, and HDF5 1.10's C headers with its shared library and the libraries it needs (libsz,
# libaec), so `kcp check` and the golden GPU tests are built there too. scripts/gpu_build.sh uses them;
# carry ".deps" (about 7 MiB). The library is the same soname (libhdf5_serial.so.103) as the GPU
# machine's own HDF5 runtime; LD_LIBRARY_PATH=.deps/hdf5/lib makes the one that matches the headers win.
#   scripts/gpu_deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include .deps/lib/cmake .deps/hdf5/lib
cp -r /usr/include/doctest .deps/include/
cp -r /usr/lib/cmake/doctest .deps/lib/cmake/
cp -r /usr/include/hdf5/serial .deps/hdf5/include
for lib in libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do cp -L "/lib/x86_64-linux-gnu/$lib" .deps/hdf5/lib/; done
ln -s libhdf5_serial.so.103 .deps/hdf5/lib/libhdf5.so  # the name FindHDF5 looks for without h5cc
du -sh .deps
