#!/usr/bin/env bash
# The shortest device call that checks a round of kernel work: the kernel test, the GPU tests,
# then Q4_K_M and Q8_0 decode on the 4B shape with the decode fusions on and off, alternated,
# and Q8_0 prompts with int8 tensor cores on and off.
# (The benches: scripts/dev/gpu_int8_ab.sh.) Everything to $OUT/verify.txt as it comes (a call cut short still returns what it measured).
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
L=$L bash scripts/dev/gpu_int8_ab.sh
stamp done
