#!/usr/bin/env bash
# The shortest device call that checks a round of kernel work: the kernel test, the GPU tests,
# then Q4_K_M and Q8_0 decode on the 4B shape with the decode fusions on and off, alternated,
# and Q8_0 prompts with int8 tensor cores on and off.
# Everything to $OUT/verify.txt as it comes (a call cut short still returns what it measured).
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/verify.txt
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
stamp kernels
timeout 100 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1
grep -E "FAIL|decode, norm|swiglu_quant|case\(s\)" $OUT/kernels.txt | tee -a $L
stamp tests
DORY_BIN=build/dory timeout 200 python3 tests/gpu/test_gpu.py > $OUT/gpu_tests.txt 2>&1
grep -E "max\|d\||agreement|decode:|prompt,|spread|greedy|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -45 | tee -a $L
wait $ck
stamp bench
build/dory quantize /tmp/dory4b /tmp/q4.gguf --type q4_k_m -q
for f in 1 0 1 0; do
  echo "fuse=$f $(DORY_CUDA_FUSE=$f DORY_CUDA_FUSE_INT8=$f build/dory bench --device cuda -m /tmp/q4.gguf -p 0 -n 64 -r 2 2>&1 | grep -E '\| tg[0-9]')" | tee -a $L
done
build/dory quantize /tmp/dory4b /tmp/q8.gguf --type q8_0 -q
for f in 1 0; do
  echo "fuse=$f $(DORY_CUDA_FUSE=$f DORY_CUDA_FUSE_INT8=$f build/dory bench --device cuda -m /tmp/q8.gguf -p 0 -n 64 -r 2 2>&1 | grep -E '\| tg[0-9]')" | tee -a $L
done
for v in 1 0 1 0; do
  for f in q8 q4; do
    echo "$f tc_int8=$v $(DORY_CUDA_TC_INT8=$v build/dory bench --device cuda -m /tmp/$f.gguf -p 512 -n 0 -r 1 2>&1 | grep -E '\| pp[0-9]')" | tee -a $L
  done
done
stamp done
