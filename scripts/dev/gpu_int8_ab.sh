#!/usr/bin/env bash
# The int8 decode fusions and int8 tensor-core prompts against their defaults (then the BF16
# prompt products: ldmatrix, cuBLAS; and a prompt profile), alternated on
# the 4B shape (Q4_K_M and Q8_0; the files are made if missing). Appends to $L.
#   L=$OUT/log.txt [SKIP_INT8=1] [ROUNDS=N] [NO_PROFILE=1] bash scripts/dev/gpu_int8_ab.sh
set -uo pipefail
L=${L:-/dev/stdout}
[ -d /tmp/dory4b ] || python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
[ -f /tmp/q4.gguf ] || build/dory quantize /tmp/dory4b /tmp/q4.gguf --type q4_k_m -q
[ -f /tmp/q8.gguf ] || build/dory quantize /tmp/dory4b /tmp/q8.gguf --type q8_0 -q
tg() { build/dory bench --device cuda -m "$1" -p 0 -n 64 -r 2 2>&1 | grep -E '\| tg[0-9]'; }
pp() { build/dory bench --device cuda -m "$1" -p 512 -n 0 -r 1 2>&1 | grep -E '\| pp[0-9]'; }
# SKIP_INT8=1 leaves out the int8 A/B (measured 2026-12-07, docs/cuda.md).
for f in 1 0; do
  [ -n "${SKIP_INT8:-}" ] && break
  for m in q4 q8; do
    echo "$m fuse_int8=$f $(DORY_CUDA_FUSE_INT8=$f tg /tmp/$m.gguf)" | tee -a $L
  done
done
for v in 1 0; do
  [ -n "${SKIP_INT8:-}" ] && break
  for m in q8 q4; do
    echo "$m tc_int8=$v $(DORY_CUDA_TC_INT8=$v pp /tmp/$m.gguf)" | tee -a $L
  done
done
# BF16 prompts: cuBLAS (the default), the ldmatrix kernel (DORY_CUDA_CUBLAS=0) and the first
# tensor-core kernel (also DORY_CUDA_TC2=0), alternated; then where a BF16 prompt's time goes,
# default and our kernel
# (DORY_CUDA_PROFILE=1: every launch timed; to $OUT/profile_pp.txt).
for r in $(seq ${ROUNDS:-2}); do
  for v in "" DORY_CUDA_CUBLAS=0 "DORY_CUDA_CUBLAS=0 DORY_CUDA_TC2=0"; do
    for p in 512 4096; do
      echo "bf16 ${v:-default} $(env $v build/dory bench --device cuda -m /tmp/dory4b -p $p -n 0 -r 1 2>&1 | grep -E '\| pp[0-9]|rror')" | tee -a $L
    done
  done
done
for v in "" DORY_CUDA_CUBLAS=0; do
  [ -n "${NO_PROFILE:-}" ] && break
  echo "== ${v:-default}" >> ${OUT:-/tmp}/profile_pp.txt
  env $v DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m /tmp/dory4b -p 512 -n 0 -r 1 >> ${OUT:-/tmp}/profile_pp.txt 2>&1
done
# Decode attention's split count (DORY_CUDA_ATT_SPLITS; default 2 x SMs / heads = 16 on the
# 4B shape): at a short context (tg64 from an empty cache) and at 4k (-d 4096).
for r in $(seq ${ROUNDS:-2}); do
  for sp in "" 1 4; do
    for d in 0 4096; do
      echo "q4 att_splits=${sp:-default} depth $d $(DORY_CUDA_ATT_SPLITS=$sp build/dory bench --device cuda -m /tmp/q4.gguf -p 0 -n 64 -r 2 -d $d 2>&1 | grep -E '\| tg[0-9]|rror')" | tee -a $L
    done
  done
done
