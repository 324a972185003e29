#!/usr/bin/env bash
# Issue 30 point 2 on the GPU: the CMF dtypes' decode against the ggml types they run as (Q8_0
# GGUF against q8_2f CMF of the 4B shape, Q4_0 GGUF against q4tp CMF of the mid-size model of
# scripts/dev/make_q4tp_pair.py; alternated, three rounds), and q8_2f's in-kernel quantizing
# (DORY_CUDA_Q8_COL=1) checked and measured. Alone (one device call, ~3 minutes):
#   bash scripts/dev/unpack_carry.sh && bash scripts/dev/gpu_cmf.sh     (log: $OUT/cmf.txt)
# or from gpu_followup.sh with CMF=1 (its log).
set -uo pipefail
OUT=${OUT:-/tmp}
L=${L:-$OUT/cmf.txt}
source scripts/dev/gpu_lib.sh
need_4b
need_kernel_test
q8=$(need_4b_as q8_0)
q82f=$(need_4b_as q8_2f)
DORY_BIN=build/dory python3 scripts/dev/make_q4tp_pair.py > /dev/null
for r in 1 2 3; do
  for m in $q8 $q82f /tmp/q4b/q4_0.gguf /tmp/q4b/cmf/model.cmf; do
    bench_line "cmf round $r $m" "" -m $m -p 0 -n 64 -r 2
  done
  # q8_2f quantizing x * col inside its products (DORY_CUDA_Q8_COL=1, not yet the default)
  bench_line "cmf round $r q8_2f in-kernel" DORY_CUDA_Q8_COL=1 -m $q82f -p 0 -n 64 -r 2
done
grep -E "q8_2f|case\(s\)" $OUT/kernels.txt | tail -10 | tee -a $L
# Decode-sized passes (chunks of 8 rows) of the built-in model as q8_2f, with and without
# the in-kernel quantizing: the same quants and the same integer sums, so the same logits.
build/dory convert models/dory-mini /tmp/mini-q82f.cmf --type q8_2f -q
ids=$(python3 -c "print(','.join(str((i * 37) % 4000 + 5) for i in range(300)))")
for q in 0 1; do
  DORY_CUDA_Q8_COL=$q build/dory logits -m /tmp/mini-q82f.cmf --ids $ids --chunk 8 --device cuda -o /tmp/lq$q.npy 2>&1 | tail -1
done
echo "q8_2f chunk 8, in-kernel against scale + quantize: $(python3 -c "import numpy as np; a = np.load('/tmp/lq0.npy'); b = np.load('/tmp/lq1.npy'); print('max |diff|', float(abs(a - b).max()), 'top-1 same', float((a.argmax(1) == b.argmax(1)).mean()))")" | tee -a $L
# Decode (one row a pass: the swiglu fusion too): greedy text, GPU with and without, and the CPU.
for dev in "cuda 0" "cuda 1" "cpu 0"; do
  set -- $dev
  DORY_CUDA_Q8_COL=$2 DORY_BF16_INPUT=float build/dory run -m /tmp/mini-q82f.cmf -p "The king said" -n 64 --temp 0 \
    --ignore-eos --device $1 > /tmp/greedy_$1$2.txt 2>/dev/null
done
echo "q8_2f greedy 64: cuda in-kernel = cuda scale+quantize: $(cmp -s /tmp/greedy_cuda0.txt /tmp/greedy_cuda1.txt && echo yes || echo no); = cpu: $(cmp -s /tmp/greedy_cuda1.txt /tmp/greedy_cpu0.txt && echo yes || echo no)" | tee -a $L
for q in 0 1; do
  DORY_CUDA_Q8_COL=$q DORY_BIN=build/dory timeout 100 python3 tests/gpu/test_gpu.py -v BuiltinModel.test_q8_2f_cmf_agreement > $OUT/gpu_q8col$q.txt 2>&1
  echo "q8_2f agreement, DORY_CUDA_Q8_COL=$q: $(grep -E 'agreement|^OK|FAIL|rror' $OUT/gpu_q8col$q.txt | tr '\n' ' ')" | tee -a $L
done
