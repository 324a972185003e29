#!/usr/bin/env bash
# q8_2f decode with its o and down inputs quantized times their column scales by the kernels
# that write them (attention, swiglu_quant: QOut::col; DORY_CUDA_COL_QUANTS=1, off until this
# has run), q/k/v/g and gate/up quantizing in the product (the default): the built-in model as
# q8_2f against the CPU with it on (agreement, greedy text), the 4B shape's tg of Q8_0 GGUF,
# q8_2f and q8_2f with it on, alternated; then the kernel test (its column-scaled swiglu_quant
# case). One short device call (~4 minutes); log $OUT/q8col.txt.
#   bash scripts/dev/unpack_carry.sh && bash scripts/dev/gpu_q8col.sh
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/q8col.txt
source scripts/dev/gpu_lib.sh
DORY_CUDA_COL_QUANTS=1 DORY_BIN=build/dory timeout 100 python3 tests/gpu/test_gpu.py -v BuiltinModel.test_q8_2f_cmf_agreement > $OUT/q8col_agree.txt 2>&1
echo "q8_2f agreement: $(grep -E 'agreement|^OK|FAIL|rror' $OUT/q8col_agree.txt | tr '\n' ' ')" | tee -a $L
build/dory convert models/dory-mini /tmp/mini-q82f.cmf --type q8_2f -q
for dev in cuda cpu; do
  DORY_CUDA_COL_QUANTS=1 DORY_BF16_INPUT=float build/dory run -m /tmp/mini-q82f.cmf -p "The king said" -n 64 --temp 0 --ignore-eos \
    --device $dev > /tmp/greedy_$dev.txt 2>/dev/null
done
echo "q8_2f greedy 64, cuda = cpu: $(cmp -s /tmp/greedy_cuda.txt /tmp/greedy_cpu.txt && echo yes || echo no)" | tee -a $L
t0=$(date +%s); need_4b; echo "4B checkpoint made in $(( $(date +%s) - t0 )) s" | tee -a $L
q8=$(need_4b_as q8_0)
q82f=$(need_4b_as q8_2f)
for r in 1 2; do
  for m in $q8 $q82f; do bench_line "round $r $m" "" -m $m -p 0 -n 64 -r 2; done
  bench_line "round $r q8_2f, column-scaled quants" DORY_CUDA_COL_QUANTS=1 -m $q82f -p 0 -n 64 -r 2
done
timeout 100 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1
grep -E "column-scaled|FAIL|case\(s\)" $OUT/kernels.txt | tail -8 | tee -a $L
