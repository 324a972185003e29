#!/usr/bin/env bash
# Where q8_2f's decode loses to Q8_0's (the 4B shape, in-kernel quantizing on), kernel by kernel
# (DORY_CUDA_PROFILE=1: graphs off, a timed event per launch), and decode attention's int8
# quants for the o product (DORY_CUDA_FUSE_ATTQ=1) alone against neither, alternated three
# rounds. One device call (~3 minutes); logs $OUT/q8prof.txt, $OUT/prof_q8_0.txt,
# $OUT/prof_q8_2f.txt.
#   bash scripts/dev/unpack_carry.sh && bash scripts/dev/gpu_q8prof.sh
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/q8prof.txt
source scripts/dev/gpu_lib.sh
need_4b
[ -f /tmp/q8.gguf ] || build/dory quantize /tmp/dory4b /tmp/q8.gguf --type q8_0 -q
[ -f /tmp/q82f.cmf ] || build/dory convert /tmp/dory4b /tmp/q82f.cmf --type q8_2f -q
[ -f /tmp/q4km.gguf ] || build/dory quantize /tmp/dory4b /tmp/q4km.gguf --type q4_k_m -q
DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m /tmp/q8.gguf -p 0 -n 16 -r 1 > $OUT/prof_q8_0.txt 2>&1
DORY_CUDA_Q8_COL=1 DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m /tmp/q82f.cmf -p 0 -n 16 -r 1 > $OUT/prof_q8_2f.txt 2>&1
for r in 1 2 3; do
  for m in /tmp/q8.gguf /tmp/q4km.gguf; do
    for a in 0 1; do
      bench_line "attq=$a round $r $m" DORY_CUDA_FUSE_ATTQ=$a -m $m -p 0 -n 64 -r 2
    done
  done
done
