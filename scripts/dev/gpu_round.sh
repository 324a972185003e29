#!/usr/bin/env bash
# One device call's worth of GPU work: the GPU tests, a per-kernel profile of decode on the
# Dory-4B shape, then scripts/gpu_bench.sh. Logs under $OUT (or /tmp). Run from the repo root
# on the GPU machine with build/dory built for it.
#   scripts/dev/gpu_round.sh [sanitize] [tests] [profile] [bench]     (default: all)
set -uo pipefail
OUT=${OUT:-/tmp}
want=${*:-sanitize tests profile bench}
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
build/dory info 2>&1 | grep -E "backend|cuda"
if [[ $want == *sanitize* ]]; then
  stamp sanitize
  T=/tmp/san; mkdir -p $T
  [ -f $T/ck/config.json ] || python3 scripts/make_checkpoint.py --out $T/ck --preset tiny --seed 7 --quiet
  build/dory quantize $T/ck $T/q4km.gguf --type q4_k_m -q
  ids=$(python3 -c "import numpy as np; print(','.join(map(str, np.random.default_rng(1).integers(0, 256, 30))))")
  for dev in cuda cpu; do
    DORY_BF16_INPUT=float build/dory logits -m $T/q4km.gguf --ids $ids --device $dev -o $T/$dev.npy 2>&1 | tail -1
  done
  python3 -c "
import numpy as np; g=np.load('$T/cuda.npy'); c=np.load('$T/cpu.npy'); d=np.abs(g-c).max(axis=-1)
print('q4km tiny per-row max|d|:', ' '.join('%.1e' % v for v in d))"
  DORY_BF16_INPUT=float DORY_CUDA_GRAPHS=0 compute-sanitizer --tool memcheck --print-limit 5 build/dory logits -m $T/q4km.gguf --ids $ids --device cuda -o $T/s.npy 2>&1 | tail -12
  DORY_BF16_INPUT=float compute-sanitizer --tool racecheck --print-limit 5 build/dory logits -m $T/q4km.gguf --ids $ids --device cuda -o $T/s.npy 2>&1 | tail -5
fi
if [[ $want == *tests* ]]; then
  stamp tests
  DORY_BIN=build/dory timeout 240 python3 tests/gpu/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
fi
if [[ $want == *profile* || $want == *bench* ]]; then
  stamp checkpoint
  [ -f /tmp/dory4b/config.json ] || python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
  for t in q8_0 q4_k_m; do
    [ -f /tmp/dory4b-$t.gguf ] || build/dory quantize /tmp/dory4b /tmp/dory4b-$t.gguf --type $t -q
  done
fi
if [[ $want == *profile* ]]; then
  for m in /tmp/dory4b /tmp/dory4b-q8_0.gguf /tmp/dory4b-q4_k_m.gguf; do
    stamp "profile $m"
    DORY_CUDA_PROFILE=1 build/dory bench -m $m --device cuda -p 512 -n 32 -r 1 2>&1 |
      tee -a "$OUT/gpu_profile.txt" | grep -A30 DORY_CUDA_PROFILE
  done
fi
if [[ $want == *bench* ]]; then
  stamp bench
  bash scripts/gpu_bench.sh "$OUT"
  stamp "BF16 2 loops pp4096 (tensor cores), then tensor cores off at pp512"
  build/dory bench -m /tmp/dory4b --device cuda -p 4096 -n 16 -r 2 2>&1 | grep -E "pp4096|tg16"
  DORY_CUDA_TC=0 build/dory bench -m /tmp/dory4b --device cuda -p 512 -n 16 -r 2 2>&1 | grep -E "pp512"
  stamp "pdl off, BF16 2 loops"
  DORY_CUDA_PDL=0 build/dory bench -m /tmp/dory4b --device cuda -p 512 -n 64 -r 3 2>&1 | grep -E "tg64|pp512 "
fi
stamp done
