#!/usr/bin/env bash
# dory.cpp against llama.cpp, decode, interleaved: PAIRS pairs of short runs D L D L ...
# (dory bench; node-llama-cpp on a llama GGUF of the same per-token work), the machine's read
# bandwidth measured before and after each run. Per run: tokens/s, GB/s (weight bytes a token
# reads x tokens/s) and its share of the mean of the two reads around it; per pair, dory's
# GB/s over llama.cpp's. Ends with the median of those ratios and their range.
#   bench/peer_ab.sh DORY_GGUF LLAMA_GGUF [PAIRS=5] [TG=48] [THREADS=2] [mmap|memory] [PP=0]
# With PP > 0 it compares prefill instead: a PP-token prompt, tokens/s, and the ratio of dory's
# tokens/s to llama.cpp's (per token; llama.cpp's model does ~13% less work a token).
# The GGUFs as bench/peer.sh makes them (dory quantize of the 4B-shaped checkpoint;
# bench/make_llama_gguf.py); node-llama-cpp installed by bench/peer.sh into bench/.peer/npm.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DF=$1 LF=$2 PAIRS=${3:-5} TG=${4:-48} T=${5:-2} WHERE=${6:-mmap} PP=${7:-0}
DORY="$ROOT/build/dory"
NPM_DIR="$ROOT/bench/.peer/npm"
[ -d "$NPM_DIR/node_modules/node-llama-cpp" ] || { echo "peer_ab.sh: run bench/peer.sh once (npm install)" >&2; exit 1; }
cp "$ROOT/bench/peer_bench.mjs" "$NPM_DIR/peer_bench.mjs"
STREAM=${STREAM:-/tmp/dory-stream}
[ -x "$STREAM" ] || gcc -O3 -march=native -fopenmp "$ROOT/bench/stream.c" -o "$STREAM"
# ~1 s of reads, all threads: the mean of the passes (GB/s)
bw() { OMP_NUM_THREADS=$(nproc) "$STREAM" 1 30 | sed -n 's/.*mean \([0-9.]*\) GB\/s.*/\1/p'; }
LB=$(/usr/bin/python3 "$ROOT/bench/make_llama_gguf.py" "$LF" --type q4_0 --bytes-only | awk '{print $2}')
MM=$([ "$WHERE" = mmap ] && echo 1 || echo 0)
DFLAG=$([ "$WHERE" = mmap ] && echo --mmap || echo --no-mmap)
echo "dory $DF | llama.cpp $LF ($LB bytes a token) | tg$TG, $T threads, weights $WHERE"
ratios=()
if [ "$PP" -gt 0 ]; then
  echo "prefill: pp$PP"
  for i in $(seq 1 "$PAIRS"); do
    b0=$(bw)
    dt=$("$DORY" bench -m "$DF" -p "$PP" -n 0 -r 1 -t "$T" $DFLAG 2>/dev/null | awk -F'|' '/ pp/{split($9, a, " "); print a[1]}')
    b1=$(bw)
    lt=$(cd "$NPM_DIR" && node peer_bench.mjs "$LF" "$PP" 1 1 "$T" "$MM" 2>/dev/null | awk '/^RESULT/{print $3}')
    b2=$(bw)
    r=$(awk -v a="$dt" -v b="$lt" 'BEGIN{printf "%.3f", a / b}')
    ratios+=("$r")
    echo "pair $i: read $b0 | dory pp$PP $dt t/s | read $b1 | llama.cpp $lt t/s | read $b2 GB/s | t/s ratio $r"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
    printf "dory / llama.cpp prefill t/s over %d pairs: median %.3f, range %.3f-%.3f\n", NR, m, v[1], v[NR]}'
  exit 0
fi
for i in $(seq 1 "$PAIRS"); do
  b0=$(bw)
  d=$("$DORY" bench -m "$DF" -p 0 -n "$TG" -r 1 -t "$T" $DFLAG 2>/dev/null |
      awk -F'|' '/ tg/{split($9, a, " "); g=$10; gsub(/ /, "", g); print a[1], g}')
  b1=$(bw)
  l=$(cd "$NPM_DIR" && node peer_bench.mjs "$LF" 16 "$TG" 1 "$T" "$MM" 2>/dev/null |
      awk -v b="$LB" '/^RESULT/{printf "%s %.2f", $6, b * $6 / 1e9}')
  b2=$(bw)
  read -r dt dg <<<"$d"; read -r lt lg <<<"$l"
  r=$(awk -v a="$dg" -v b="$lg" 'BEGIN{printf "%.3f", a / b}')
  ratios+=("$r")
  awk -v i="$i" -v b0="$b0" -v b1="$b1" -v b2="$b2" -v dt="$dt" -v dg="$dg" -v lt="$lt" -v lg="$lg" -v r="$r" 'BEGIN{
    printf "pair %d: dory %.2f t/s %.2f GB/s (%.0f%% of %.1f) | llama.cpp %.2f t/s %.2f GB/s (%.0f%% of %.1f) | GB/s ratio %s\n",
      i, dt, dg, 100 * dg / ((b0 + b1) / 2), (b0 + b1) / 2, lt, lg, 100 * lg / ((b1 + b2) / 2), (b1 + b2) / 2, r}'
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
  printf "dory / llama.cpp decode GB/s over %d pairs: median %.3f, range %.3f-%.3f\n", NR, m, v[1], v[NR]}'
