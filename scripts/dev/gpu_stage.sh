#!/usr/bin/env bash
# Flash attention with the chunk's keys and values staged once (DORY_CUDA_FLASH_STAGE=1)
# against per-tile conversion in every block (=0): the kernel test's staged and unstaged cases
# (run here unless $OUT/kernels.txt is there), pp4096 and pp512 of the 4B shape alternated,
# a pp4096 profile staged, the built-in model's BF16 agreement with the CPU and a compute-
# sanitizer pass staged. One device call after gpu_cmf.sh (~3 minutes); log $OUT/stage.txt.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/stage.txt
source scripts/dev/gpu_lib.sh
need_4b
need_kernel_test
grep -E "attention.*(1000|1100)|FAIL|case\(s\)" $OUT/kernels.txt | tail -12 | tee -a $L
for r in 1 2 3; do
  for s in 0 1; do
    bench_line "stage=$s round $r" DORY_CUDA_FLASH_STAGE=$s -m /tmp/dory4b -p 4096 -n 0 -r 1
  done
done
for r in 1 2; do
  for s in 0 1; do
    bench_line "stage=$s round $r" DORY_CUDA_FLASH_STAGE=$s -m /tmp/dory4b -p 512 -n 0 -r 2
  done
done
DORY_CUDA_FLASH_STAGE=1 DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m /tmp/dory4b -p 4096 -n 0 -r 1 > $OUT/profile_stage.txt 2>&1
grep -E "attention|prefill" $OUT/profile_stage.txt | head -8 | tee -a $L
DORY_CUDA_FLASH_STAGE=1 DORY_BIN=build/dory timeout 120 python3 tests/gpu/test_gpu.py -v BuiltinModel.test_bf16_agreement BuiltinModel.test_prompts_on_tensor_cores > $OUT/stage_agree.txt 2>&1
echo "staged: $(grep -E 'agreement|^OK|FAIL|rror|Ran' $OUT/stage_agree.txt | tr '\n' ' ')" | tee -a $L
ids=$(python3 -c "print(','.join(str((i * 37) % 4000 + 5) for i in range(300)))")
DORY_CUDA_FLASH_STAGE=1 DORY_CUDA_GRAPHS=0 timeout 120 compute-sanitizer --tool memcheck --print-limit 5 build/dory logits -m models/dory-mini --ids $ids --chunk 128 --device cuda -o /tmp/s.npy 2>&1 | grep -E "ERROR SUMMARY|Invalid|out of bounds" | head -3 | sed 's/^/memcheck staged: /' | tee -a $L
DORY_CUDA_FLASH_STAGE=1 timeout 120 compute-sanitizer --tool racecheck --print-limit 5 build/dory logits -m models/dory-mini --ids $ids --chunk 128 --device cuda -o /tmp/s.npy 2>&1 | grep -E "RACECHECK SUMMARY|hazard" | head -3 | sed 's/^/racecheck staged: /' | tee -a $L
