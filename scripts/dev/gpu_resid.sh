#!/usr/bin/env bash
# Two decode fusions of the sixth session on a GPU: the nGPT residual in the products'
# epilogue (DORY_CUDA_FUSE_RESID=1) and an int8 o product's input quantized by decode attention
# (DORY_CUDA_FUSE_ATTQ=1). The kernel test's residual cases (run here unless $OUT/kernels.txt
# is there); the decode-fusion tests of tests/gpu with both on (fused against DORY_CUDA_FUSE=0
# and against the CPU); greedy text with and without; the 4B shape's decode logits (Q8_0,
# Q4_K_M) with attention's quants against the quantizing launch (the same quants: bit-equal);
# tg64 of BF16 / Q8_0 / Q4_K_M with neither, the residual, both, alternated twice. One device
# call (~5 minutes); log $OUT/resid.txt.
#   bash scripts/dev/unpack_carry.sh && bash scripts/dev/gpu_resid.sh
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/resid.txt
source scripts/dev/gpu_lib.sh
need_4b
need_kernel_test
grep -E "residual|FAIL|case\(s\)" $OUT/kernels.txt | tail -20 | tee -a $L
DORY_CUDA_FUSE_RESID=1 DORY_CUDA_FUSE_ATTQ=1 DORY_BIN=build/dory timeout 200 python3 tests/gpu/test_gpu.py -v \
  TinyParity.test_decode_fusions BuiltinModel.test_int8_decode_fusions BuiltinModel.test_greedy_run_is_the_same \
  BuiltinModel.test_long_decode > $OUT/resid_tests.txt 2>&1
echo "tests with both fusions: $(grep -E 'fused|^OK|FAIL|rror|Ran' $OUT/resid_tests.txt | tr '\n' ' ')" | tee -a $L
for q in 0 1; do
  DORY_CUDA_FUSE_RESID=$q DORY_CUDA_FUSE_ATTQ=$q build/dory run -m models/dory-mini -p "The king said" -n 64 --temp 0 \
    --ignore-eos --device cuda > /tmp/resid_greedy$q.txt 2>/dev/null
done
echo "greedy 64 tokens, both fusions = neither: $(cmp -s /tmp/resid_greedy0.txt /tmp/resid_greedy1.txt && echo yes || echo no)" | tee -a $L
for t in q8_0 q4_k_m; do need_4b_as $t > /dev/null; done
ids=$(python3 -c "print(','.join(str((i * 7919) % 100000 + 3) for i in range(40)))")
for t in q8_0 q4_k_m; do
  for a in 0 1; do
    DORY_CUDA_FUSE_ATTQ=$a build/dory logits -m /tmp/dory4b-$t.gguf --ids $ids --chunk 1 --device cuda -o /tmp/attq$a.npy 2>&1 | tail -1
  done
  echo "4B $t decode logits, attention's quants against the quantizing launch: max|diff| $(python3 -c "import numpy as np; print(float(abs(np.load('/tmp/attq0.npy') - np.load('/tmp/attq1.npy')).max()))")" | tee -a $L
done
for r in 1 2; do
  for m in /tmp/dory4b /tmp/dory4b-q8_0.gguf /tmp/dory4b-q4_k_m.gguf; do
    for v in "DORY_CUDA_FUSE_RESID=0" "DORY_CUDA_FUSE_RESID=1" "DORY_CUDA_FUSE_RESID=1 DORY_CUDA_FUSE_ATTQ=1"; do
      bench_line "$v round $r $m" "$v" -m $m -p 0 -n 64 -r 2
    done
  done
done
