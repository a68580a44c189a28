# Sourced by scripts/gpu_ab.sh and scripts/gpu_switch_ab.sh (from the repository root, with S the
# summary file and L the log folder set): FLA's kernels timed in the same call as kcp's, for the
# shapes in FLA_SHAPES (scripts/bench_fla_backward.py; FLA from .fla, carried).
#   fla_warm_up &   ... kcp's tests and benches ...   wait; fla_tables
# Triton >= 3.4 caches autotuning timings on disk (FLA passes cache_results=True unless
# FLA_CACHE_RESULTS=0): the warm-up's timings come back as $OUT/fla-autotune.tgz (the *.autotune.json
# files alone, a few KB), and a copy carried as .fla-autotune.tgz (git-ignored) is unpacked into the
# cache first, so that a later call on the same kind of machine compiles only the configs those
# timings chose instead of tuning them all again (2026-11-30: the warm-up took ~250 s of a 445 s call).
# Only the untimed warm-up changes: the timed runs are the same kernels, chosen the same way.
export FLA_PATH=$PWD/.fla TRITON_CACHE_DIR=/tmp/triton-cache
if [ -n "${FLA_SHAPES:-}" ] && [ -f .fla-autotune.tgz ]; then
  mkdir -p $TRITON_CACHE_DIR && tar xzf .fla-autotune.tgz -C $TRITON_CACHE_DIR && echo "fla: autotune timings carried in" >> $S
fi
fla() {  # $1: seconds, $2: log name, then bench_fla_backward.py's arguments; returns the run's exit code
  local lim=$1 log=$L/$2 rc; shift 2
  timeout $lim python3 scripts/bench_fla_backward.py --shapes "$FLA_SHAPES" "$@" > $log 2>&1; rc=$?
  echo "fla $* rc=$rc" >> $S
  return $rc
}
# Triton's compile and autotuning, untimed (a forward+backward compiles the forward's kernels too: a
# forward-only warm-up of gla ran past 150 s on the H200 of 2026-11-28 and was not needed).
fla_warm_up() {
  [ -z "${FLA_SHAPES:-}" ] && return 0
  fla 300 fla_warm.log --repeat 2 --warmup 1 && touch $L/fla_warm.ok
}
# The timed forward and forward+backward, their table lines into the summary; with files of kcp's
# `kcp bench` rows ($1 forward, $2 forward+backward: scripts/bench_backward.sh) the tables carry kcp's
# medians and the ratio FLA / kcp. Without a finished warm-up the forward+backward would compile again
# inside its own limit (on 2026-11-29 that ran the call past the device tool's 600 s): it is left out,
# and the summary says so.
fla_tables() {
  [ -n "${FLA_SHAPES:-}" ] || return 0
  local kf=() kb=()
  [ -n "${1:-}" ] && kf=(--kcp "$1")
  [ -n "${2:-}" ] && kb=(--kcp "$2")
  fla 150 fla_fwd.log --forward "${kf[@]}"; grep -E "^\| (gdn|kda|gla) " $L/fla_fwd.log | sed 's/^/FLA fwd: /' >> $S
  if [ ! -e $L/fla_warm.ok ]; then  # what it tuned before its limit still shortens the next call's
    echo "FLA fwd+bwd: not timed (the warm-up did not finish)" >> $S; fla_autotune_out; return 0
  fi
  fla 200 fla_bwd.log "${kb[@]}"; grep -E "^\| (gdn|kda|gla) " $L/fla_bwd.log | sed 's/^/FLA fwd+bwd: /' >> $S
  fla_autotune_out
}
# The warm-up's autotuning timings into $OUT (see the top of this file).
fla_autotune_out() {
  local dst n
  dst=$(cd "${OUT:-.}" && pwd)/fla-autotune.tgz
  n=$(cd $TRITON_CACHE_DIR 2>/dev/null && find . -name '*.autotune.json' | wc -l)
  [ "${n:-0}" -gt 0 ] || return 0
  (cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf "$dst" -T -) &&
    echo "fla: $n autotune timing files -> \$OUT/fla-autotune.tgz (carry it as .fla-autotune.tgz)" >> $S
}
