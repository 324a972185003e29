#!/usr/bin/env bash
# bench/peer.sh: dory.cpp side by side with llama.cpp (through node-llama-cpp 3.21.1, its
# prebuilt linux-x64 CPU build) and the machine's memory read bandwidth, on one machine in
# one run. See bench/README.md.
#
#   bench/peer.sh [--types "q8_0 q4_0 q4_k_m"] [--threads 2] [--reps 3] [--pp 512] [--tg 128]
#                 [--src /tmp/dory4b] [--models DIR] [--gib 2] [--keep] [--skip-llama] [--skip-dory]
#                 [--mmap]
#
# Both engines read the weights into memory at load (dory bench --no-mmap, node-llama-cpp
# useMmap: false; decode streams them faster from there); --mmap runs both on the mapped file.
# Makes what is missing (the 4B-shaped random Dory checkpoint, its GGUFs, the llama GGUFs,
# the npm install under bench/.peer/), reuses what is already there, and at the end deletes
# the model files this run made, unless --keep. Raw outputs go to bench/.peer/logs/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TYPES="q8_0 q4_0 q4_k_m"; THREADS=2; REPS=3; PP=512; TG=128; SRC=/tmp/dory4b; MODELS=/tmp
GIB=2; KEEP=0; SKIP_LLAMA=0; SKIP_DORY=0; MMAP=0
NLC_VERSION=3.21.1
PY=/usr/bin/python3
while [ $# -gt 0 ]; do
  case "$1" in
    --types) TYPES="$2"; shift 2 ;;
    --threads|-t) THREADS="$2"; shift 2 ;;
    --reps|-r) REPS="$2"; shift 2 ;;
    --pp|-p) PP="$2"; shift 2 ;;
    --tg|-n) TG="$2"; shift 2 ;;
    --src) SRC="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --gib) GIB="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --skip-llama) SKIP_LLAMA=1; shift ;;
    --skip-dory) SKIP_DORY=1; shift ;;
    --mmap) MMAP=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "peer.sh: unknown option $1" >&2; exit 1 ;;
  esac
done

WORK="$ROOT/bench/.peer"        # scratch: npm install, stream binary, driver, logs (git-ignored)
LOGS="$WORK/logs"
mkdir -p "$WORK" "$LOGS" "$MODELS"
MADE=()                         # files/dirs this run created, removed at exit unless --keep
cleanup() {
  if [ "$KEEP" = 0 ] && [ ${#MADE[@]} -gt 0 ]; then
    for f in "${MADE[@]}"; do echo "[peer] removing $f (made by this run; --keep keeps it)"; rm -rf -- "$f"; done
  fi
  rm -f "$MODELS"/*.peer.tmp 2>/dev/null || true
}
trap cleanup EXIT
say() { echo "[peer $(date -u +%H:%M:%S)] $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

say "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load $(load)"

# ---------------------------------------------------------------- (a) memory read bandwidth
CC="${CC:-cc}"
say "compiling bench/stream.c with $CC -O3 -march=native -fopenmp"
"$CC" -O3 -march=native -fopenmp "$ROOT/bench/stream.c" -o "$WORK/stream"
say "stream read, $(nproc) threads, $GIB GiB array, best of 10 (load $(load))"
OMP_NUM_THREADS=$(nproc) OMP_PROC_BIND=spread "$WORK/stream" "$GIB" 10 | tee "$LOGS/stream.txt"
STREAM_ALL=$(awk '/^STREAM_BEST_GBS/{print $2}' "$LOGS/stream.txt")
if [ "$THREADS" != "$(nproc)" ]; then
  OMP_NUM_THREADS=$THREADS "$WORK/stream" "$GIB" 10 | tee "$LOGS/stream_t.txt"
  STREAM_T=$(awk '/^STREAM_BEST_GBS/{print $2}' "$LOGS/stream_t.txt")
else
  STREAM_T=$STREAM_ALL
fi
# The bandwidth this machine gives moves with where its cores sit on the host: on the 2-core
# VM it was built on, 1 GiB reads a second apart give ~37 or ~55 GB/s, flipping every few
# seconds, so a best-of-N read overstates what a run of many seconds can get. Each repetition
# of each engine is therefore its own run, with a read of ~3 s before and after it (1 GiB,
# 100 passes, all threads; their time-weighted mean, and the best pass), and the % column is
# the engine's tg GB/s against the mean of those reads (both averaged over the repetitions).
bw() { OMP_NUM_THREADS=$(nproc) OMP_PROC_BIND=spread "$WORK/stream" 1 100 |
       sed -n 's/.*best \([0-9.]*\) GB\/s, mean \([0-9.]*\) GB\/s.*/\2 \1/p'; }
declare -A BW
# stats "x1 x2 ...": "mean sd" (sample sd; 0 for one value)
stats() { awk '{ n = NF; for (i = 1; i <= n; i++) s += $i; m = s / n; for (i = 1; i <= n; i++) v += ($i - m) ^ 2;
                 printf "%.2f %.2f", m, (n > 1 ? sqrt(v / (n - 1)) : 0) }' <<<"$1"; }

# ---------------------------------------------------------------- dory binary and checkpoint
DORY="$ROOT/build/dory"
if [ "$SKIP_DORY" = 0 ] && [ ! -x "$DORY" ]; then
  say "build/dory missing: building"
  cmake -S "$ROOT" -B "$ROOT/build" -G Ninja >/dev/null && cmake --build "$ROOT/build" --target dory
fi
if [ "$SKIP_DORY" = 0 ] && [ ! -f "$SRC/config.json" ]; then
  say "making the random-weight 4B-shaped Dory checkpoint at $SRC (~8 GB, ~80 s)"
  MADE+=("$SRC")
  "$PY" "$ROOT/scripts/make_checkpoint.py" --out "$SRC" --preset 4b
fi

# ---------------------------------------------------------------- node-llama-cpp
NPM_DIR="$WORK/npm"
NODE_OK=0
if [ "$SKIP_LLAMA" = 0 ]; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    say "node/npm not found: llama.cpp column skipped"
  else
    mkdir -p "$NPM_DIR"
    have=$(node -p "try{require('$NPM_DIR/node_modules/node-llama-cpp/package.json').version}catch(e){''}" 2>/dev/null || true)
    if [ "$have" != "$NLC_VERSION" ]; then
      say "npm install node-llama-cpp@$NLC_VERSION into $NPM_DIR"
      [ -f "$NPM_DIR/package.json" ] || echo '{"name":"dory-peer-bench","private":true}' > "$NPM_DIR/package.json"
      (cd "$NPM_DIR" && npm install --no-audit --no-fund --save-exact "node-llama-cpp@$NLC_VERSION") 2>&1 | tail -5 >&2
    fi
    NODE_OK=1
  fi
fi
# the timing driver: a fresh context, pp = one evaluation of PP random ids (batch 512, no
# sampling), then on an empty sequence tg = TG single-token decodes each sampled greedily
# (logits computed, so the output matrix is read every token), as llama-bench's pp and tg
# and dory bench's (tg at depth 0; until 2026-12-05 this driver ran tg after the prompt,
# against dory's at depth 0); a short warm-up first
[ "$NODE_OK" = 1 ] && cp "$ROOT/bench/peer_bench.mjs" "$NPM_DIR/peer_bench.mjs" || true

# ---------------------------------------------------------------- per type
declare -A ROW
# bracketed ENGINE TYPE: REPS runs of rep_ENGINE (one repetition each), every one between two
# bw() reads; parse_ENGINE LOG prints "pp tg GB/s" of a run. Fills ROW and BW, or marks the
# row failed (with the log on stderr) when a run fails.
bracketed() {
  local eng=$1 ty=$2 log="$LOGS/$1-$2.txt" rep="$LOGS/$1-$2.rep.txt"
  local r b0 x0 b1 x1 pp tg gb pps="" tgs="" gbs="" bws="" bests=""
  : > "$log"
  for r in $(seq "$REPS"); do
    read -r b0 x0 < <(bw)
    if ! "rep_$eng" > "$rep" 2>&1; then
      cat "$rep" >> "$log"; cat "$log" >&2
      say "$eng FAILED on $ty (log above: $log)"
      ROW["$eng,$ty"]="failed|failed|-"
      return
    fi
    read -r b1 x1 < <(bw)
    cat "$rep" >> "$log"
    read -r pp tg gb < <("parse_$eng" "$rep")
    say "  run $r/$REPS: pp$PP $pp t/s, tg$TG $tg t/s = $gb GB/s; read BW before/after: mean $b0 / $b1, best $x0 / $x1 GB/s"
    pps+=" $pp"; tgs+=" $tg"; gbs+=" $gb"; bws+=" $b0 $b1"; bests+=" $x0 $x1"
  done
  ROW["$eng,$ty"]="$(stats "$pps")|$(stats "$tgs")|$(stats "$gbs")"
  BW["$eng,$ty"]="$(stats "$bws")|$(stats "$bests")"
}
rep_dory() { "$DORY" bench -m "$df" -p "$PP" -n "$TG" -r 1 -t "$THREADS" "$([ "$MMAP" = 1 ] && echo --mmap || echo --no-mmap)"; }
# | model | size | params | loops | kv | threads | test | t/s | GB/s |
parse_dory() {
  awk -F'|' -v p="pp$PP" -v t="tg$TG" '$8 ~ " "p" " {split($9, a, " "); pp = a[1]}
    $8 ~ " "t" " {split($9, a, " "); tg = a[1]; gb = $10; gsub(/ /, "", gb)} END {print pp, tg, gb}' "$1"
}
rep_llama() { (cd "$NPM_DIR" && node peer_bench.mjs "$lf" "$PP" "$TG" 1 "$THREADS" "$MMAP"); }
# RESULT pp MEAN SD tg MEAN SD
parse_llama() { awk -v b="$bytes" '/^RESULT/ {printf "%s %s %.2f\n", $3, $6, b * $6 / 1e9}' "$1"; }

for ty in $TYPES; do
  # (c) dory
  if [ "$SKIP_DORY" = 0 ]; then
    df="$MODELS/dory4b-$ty.gguf"
    if [ ! -f "$df" ]; then
      say "dory quantize $SRC -> $df ($ty)"
      MADE+=("$df")
      "$DORY" quantize "$SRC" "$df" --type "$ty" -q
    else
      say "reusing $df"
    fi
    say "dory bench $ty: -p $PP -n $TG -t $THREADS, $REPS runs of -r 1 (load $(load))"
    bracketed dory "$ty"
  fi
  # (b) llama.cpp
  case "$ty" in q8_0|q4_0) ;; *) continue ;; esac
  if [ "$NODE_OK" = 1 ]; then
    lf="$MODELS/llama4b-$ty.gguf"
    if [ ! -f "$lf" ]; then
      say "make_llama_gguf.py $lf ($ty)"
      MADE+=("$lf")
      "$PY" "$ROOT/bench/make_llama_gguf.py" "$lf" --type "$ty" >&2
    else
      say "reusing $lf"
    fi
    bytes=$("$PY" "$ROOT/bench/make_llama_gguf.py" "$lf" --type "$ty" --bytes-only | awk '{print $2}')
    say "node-llama-cpp $ty: pp$PP tg$TG, $THREADS threads, $REPS runs of one repetition (load $(load))"
    bracketed llama "$ty"
  fi
done

# ---------------------------------------------------------------- table
echo
read -r STREAM_END _ < <(bw)
echo "memory read bandwidth (bench/stream.c): at the start $STREAM_ALL GB/s with $(nproc) threads (2 GiB, best of 10), $STREAM_T GB/s with $THREADS; at the end $STREAM_END GB/s (1 GiB, mean of 100 passes)"
echo "load average at the end: $(load)"
echo "weights: $([ "$MMAP" = 1 ] && echo "mapped from the files by both engines (--mmap)" || echo "read into memory by both engines (dory --no-mmap, node-llama-cpp useMmap: false)")"
echo
echo "| engine | type | threads | pp$PP t/s | tg$TG t/s | tg GB/s | read BW around the runs: mean (best pass), GB/s | tg GB/s / mean read BW |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
pm() { [ "$1" = failed ] && echo failed || { read -r m sd <<<"$1"; echo "$m ± $sd"; }; }
for ty in $TYPES; do
  for eng in dory llama; do
    v="${ROW[$eng,$ty]:-}"
    [ -n "$v" ] || continue
    IFS='|' read -r pp tg gb <<<"$v"
    read -r gbm _ <<<"$gb"
    IFS='|' read -r bwm bwx <<<"${BW[$eng,$ty]:-|}"
    read -r bwmean _ <<<"$bwm"; read -r bwbest _ <<<"$bwx"
    pct=$(awk -v g="${gbm:-0}" -v b="${bwmean:-0}" 'BEGIN{ if (g > 0 && b > 0) printf "%.0f%%", 100*g/b; else print "-" }')
    name=$([ "$eng" = dory ] && echo "dory.cpp" || echo "llama.cpp (node-llama-cpp $NLC_VERSION)")
    echo "| $name | $ty | $THREADS | $(pm "$pp") | $(pm "$tg") | ${gbm:--} | ${bwmean:--} (${bwbest:--}) | $pct |"
  done
done
