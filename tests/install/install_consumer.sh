#!/usr/bin/env bash
# The installed library as a user meets it: `cmake --install` the build into a fresh prefix, check
# the layout (headers under include/kcp, kcpConfig.cmake, the kcp program), then configure, build
# and run examples/ against that prefix through find_package(kcp) (CP example on 2 ranks when MPI is
# installed). Usage: install_consumer.sh BUILD_DIR SOURCE_DIR WORK_DIR [MPIEXEC]
set -euo pipefail
build=$1 src=$2 work=$3 mpiexec=${4:-}
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/kcp/core/backend.h include/kcp/reference/backend_cpu.h lib/cmake/kcp/kcpConfig.cmake \
         lib/cmake/kcp/kcpTargets.cmake bin/kcp; do
  [ -e "$prefix/$f" ] || { echo "install_consumer: $prefix/$f was not installed"; exit 1; }
done
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$src/examples" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$work/build" -j 2
"$work/build/oracle_forward"
if [ -x "$work/build/cp_forward" ]; then
  [ -n "$mpiexec" ] || mpiexec=mpirun
  flags=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  "$mpiexec" "${flags[@]}" -np 2 "$work/build/cp_forward"
  "$work/build/cp_forward"  # singleton: one rank holds everything
fi
"$prefix/bin/kcp" --help > "$work/help.txt" 2>&1
grep -q bench "$work/help.txt" || { echo "install_consumer: the installed kcp does not list its commands"; exit 1; }
echo "install_consumer: ok"
