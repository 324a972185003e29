#!/usr/bin/env bash
# The shortest device call that checks a round of kernel work: the kernel test, the GPU tests,
# then the A/B benches of scripts/dev/gpu_int8_ab.sh (int8 decode fusions, int8 tensor-core
# prompts, the BF16 ldmatrix product, each on and off, alternated; a prompt profile).
# Everything to $OUT/verify.txt as it comes (a call cut short still returns what it measured).
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/verify.txt
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
stamp kernels
timeout 150 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1
grep -E "FAIL|ldmatrix|2304x512|case\(s\)" $OUT/kernels.txt | tee -a $L
stamp tests
DORY_BIN=build/dory timeout 240 python3 tests/gpu/test_gpu.py -v > $OUT/gpu_tests.txt 2>&1
grep -E "max\|d\||agreement|decode:|prompt:|spread|greedy|skill dynamic|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -45 | tee -a $L
wait $ck
stamp bench
L=$L bash scripts/dev/gpu_int8_ab.sh
stamp done
