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
q8=$(need_4b_as q8_0)
q82f=$(need_4b_as q8_2f)
q4km=$(need_4b_as q4_k_m)
DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m $q8 -p 0 -n 16 -r 1 > $OUT/prof_q8_0.txt 2>&1
DORY_CUDA_Q8_COL=1 DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m $q82f -p 0 -n 16 -r 1 > $OUT/prof_q8_2f.txt 2>&1
for r in 1 2 3; do
  for m in $q8 $q4km; do
    for a in 0 1; do
      bench_line "attq=$a round $r $m" DORY_CUDA_FUSE_ATTQ=$a -m $m -p 0 -n 64 -r 2
    done
  done
done
