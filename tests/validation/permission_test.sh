#!/bin/sh
# A dump the user may not read: one line "FILE: permission denied ...", exit 2 (not "not an HDF5
# file"). Root reads every file, so as root the check runs as the user nobody (su), and is skipped
# (ctest exit 77) where that is impossible. Usage: permission_test.sh KCP GOLDEN_FILE
kcp="$1"
src="$2"
dir=$(mktemp -d /tmp/kcp_perm.XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
cp "$src" "$dir/locked.h5"
chmod 000 "$dir/locked.h5"
if [ "$(id -u)" -eq 0 ]; then
  command -v su > /dev/null && id nobody > /dev/null 2>&1 || { echo "SKIP: root without su/nobody"; exit 77; }
  out=$(su nobody -s /bin/sh -c "'$kcp' info '$dir/locked.h5'" 2>&1); rc=$?
  [ $rc -eq 126 ] || [ $rc -eq 127 ] && { echo "SKIP: nobody cannot run $kcp ($out)"; exit 77; }
else
  out=$("$kcp" info "$dir/locked.h5" 2>&1); rc=$?
fi
echo "$out"
lines=$(printf '%s\n' "$out" | wc -l)
if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && printf '%s' "$out" | grep -qF "$dir/locked.h5: permission denied"; then
  echo "PASS: exit 2, one line naming the file and the permission"
  exit 0
fi
echo "FAIL: exit $rc, $lines line(s)"
exit 1
