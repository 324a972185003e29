#!/usr/bin/env bash
# dory bench --device cuda on the Dory-4B shape (random weights, the published config):
# BF16 at loops 1, 2, 4, then Q8_0 and Q4_K_M at 2 loops. Run on the GPU machine from the
# repository root; makes /tmp/dory4b (~8 GB) and the GGUFs if missing.
#   scripts/gpu_bench.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-/tmp}
PY=${PY:-python3}
[ -f /tmp/dory4b/config.json ] || "$PY" scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
for loops in 1 2 4; do
  build/dory bench -m /tmp/dory4b --device cuda -p 512 -n 64 -r 3 --loops $loops 2>&1 | tee -a "$OUT/gpu_bench.txt" | grep -v "^|.---"
done
for t in q8_0 q4_k_m; do
  [ -f /tmp/dory4b-$t.gguf ] || build/dory quantize /tmp/dory4b /tmp/dory4b-$t.gguf --type $t -q
  build/dory bench -m /tmp/dory4b-$t.gguf --device cuda -p 512 -n 64 -r 3 2>&1 | tee -a "$OUT/gpu_bench.txt" | grep -v "^|.---"
done
