#!/usr/bin/env bash
# Hashes of logits over the parity fixtures, the built-in model and a turbo file, for a
# refactoring that must not change a number: run it before and after with the two binaries
# and diff the outputs (each line: case, sha256 of the float32 .npy).
#   scripts/dev/logit_hashes.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$1" && pwd)/dory
W=${2:-/tmp/dory-logit-hashes}
PY=/usr/bin/python3
mkdir -p "$W"
export DORY_BF16_INPUT=float
[ -d "$W/tiny" ] || $PY "$ROOT/scripts/make_checkpoint.py" --out "$W/tiny" --quiet
[ -d "$W/mqa" ] || $PY "$ROOT/scripts/make_checkpoint.py" --out "$W/mqa" --quiet --set num_key_value_heads=1 --seed 3
[ -d "$W/f32" ] || $PY "$ROOT/scripts/make_checkpoint.py" --out "$W/f32" --quiet --dtype f32 --seed 5
IDS=$(seq 1 1 97 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%250+1}')
MINI=$ROOT/models/dory-mini
MIDS=$(seq 1 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%4000+3}')
hash() { sha256sum "$1" | cut -c1-16; }
one() {  # name model ids flags...
  local name=$1 model=$2 ids=$3; shift 3
  "$BIN" logits -m "$model" --ids "$ids" -o "$W/out.npy" -t 2 "$@" 2>/dev/null
  printf '%-44s %s\n' "$name" "$(hash "$W/out.npy")"
}
for m in tiny mqa f32; do
  for kv in per_loop last_loop; do
    for ch in 1 7 64; do
      for lp in 1 2 4 16; do
        one "$m $kv chunk$ch loops$lp" "$W/$m" "$IDS" --kv $kv --chunk $ch --loops $lp
      done
    done
  done
done
one "tiny last_loop gate conf:0.3" "$W/tiny" "$IDS" --kv last_loop --chunk 1 --gate conf:0.3
one "tiny last_loop prompt-loops 1" "$W/tiny" "$IDS" --kv last_loop --chunk 8 --prompt-loops 1 --prompt-rows 60
one "tiny o1 per_loop" "$W/tiny" "$IDS" --kv per_loop --chunk 1 --o1 8,8,2,40
one "tiny o1 last_loop chunk16" "$W/tiny" "$IDS" --kv last_loop --chunk 16 --o1 8,8,2,40
one "mini default" "$MINI" "$MIDS"
one "mini last_loop chunk16 loops4" "$MINI" "$MIDS" --kv last_loop --chunk 16 --loops 4
one "mini gate conf:0.5" "$MINI" "$MIDS" --kv last_loop --chunk 1 --gate conf:0.5
one "mini o1 32,64,4,128" "$MINI" "$MIDS" --o1 32,64,4,128
if [ ! -f "$W/mini-turbo.gguf" ]; then
  "$BIN" calibrate -m "$MINI" -f /usr/share/common-licenses/GPL-3 -o "$W/mini-turbo.gguf" -t 2 >/dev/null 2>&1 || true
fi
if [ -f "$W/mini-turbo.gguf" ]; then
  one "mini turbo default" "$W/mini-turbo.gguf" "$MIDS"
  one "mini turbo o1+exact prompt-rows 250" "$W/mini-turbo.gguf" "$MIDS" --o1 16,32,4,64 --exact 32 --prompt-rows 250
fi
