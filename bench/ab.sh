#!/usr/bin/env bash
# Two dory binaries (or versions) compared as the project measures: short runs alternating
# A B A B ..., the machine's read bandwidth measured around each pair, and per pair the
# ratio B/A. Prints one line per run and a summary (median ratio and its range).
#   bench/ab.sh A_BIN B_BIN PAIRS -- BENCH_ARGS...
# e.g. bench/ab.sh /tmp/old/dory build/dory 5 -- -m model.gguf -p 0 -n 32 -r 1 -t 2
# A_EXTRA / B_EXTRA (environment) are added to one side's arguments only: two files on one
# binary, e.g. A_EXTRA="-m q4_0.gguf" B_EXTRA="-m q4tp.cmf" bench/ab.sh build/dory build/dory 5 -- -p 0 -n 32
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
A=$1 B=$2 PAIRS=$3
shift 3
[ "${1:-}" = "--" ] && shift
STREAM=${STREAM:-/tmp/dory-stream}
[ -x "$STREAM" ] || gcc -O3 -march=native -fopenmp "$ROOT/bench/stream.c" -o "$STREAM"
bw() { OMP_NUM_THREADS=$(nproc) "$STREAM" 1 3 | awk '/^STREAM_BEST_GBS/{print $2}'; }
# The last table row's t/s (the mean over repetitions) of dory bench.
run() { local bin=$1; shift; "$bin" bench "$@" 2>/dev/null | awk -F'|' '/ tg| pp/{v=$9} END{gsub(/ /,"",v); split(v,a,"±"); print a[1]}'; }
ratios=()
for i in $(seq 1 "$PAIRS"); do
  # shellcheck disable=SC2086  # the extras are word lists
  b0=$(bw); ta=$(run "$A" "$@" ${A_EXTRA:-}); b1=$(bw); tb=$(run "$B" "$@" ${B_EXTRA:-}); b2=$(bw)
  r=$(awk -v a="$ta" -v b="$tb" 'BEGIN{printf "%.3f", b/a}')
  ratios+=("$r")
  printf 'pair %d: read %s | A %s t/s | read %s | B %s t/s | read %s GB/s | B/A %s\n' "$i" "$b0" "$ta" "$b1" "$tb" "$b2" "$r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "B/A over %d pairs: median %.3f, range %.3f-%.3f\n", NR, m, v[1], v[NR]}'
