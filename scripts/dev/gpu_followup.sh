#!/usr/bin/env bash
# A short device call after gpu_verify.sh: the kernel test, the GPU tests named in TESTS (or
# decode past 2,048 keys, greedy text, skill-dynamic, BF16 agreement), BF16 pp512/pp4096, where a pp4096
# prompt's time goes (DORY_CUDA_PROFILE=1, to $OUT/profile_pp4096.txt), and Q4_K_M decode at
# attention splits 16 (default) and 32, at depth 0 and 4096; with CMF=1 the CMF dtypes against
# the ggml types they run as (below). Log: $OUT/followup.txt.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/followup.txt
source scripts/dev/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
timeout 100 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1
grep -E "FAIL|cuBLAS|case\(s\)" $OUT/kernels.txt | tail -6 | tee -a $L
TESTS=${TESTS:-"BuiltinModel.test_long_decode BuiltinModel.test_greedy_run_is_the_same BuiltinModel.test_skill_dynamic_follows_the_text_as_on_the_cpu BuiltinModel.test_bf16_agreement"}
# shellcheck disable=SC2086  # a list of test names
DORY_BIN=build/dory timeout 200 python3 tests/gpu/test_gpu.py -v $TESTS > $OUT/gpu_tests.txt 2>&1
grep -E "skill dynamic|agreement|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -20 | tee -a $L
wait $ck
for p in 512 4096; do
  bench_line "bf16 defaults" "" -m /tmp/dory4b -p $p -n 0 -r 1
done
# The flash kernel with 8 warps (128 query rows a block) against the default 4, alternated.
for r in 1 2; do
  for fw in 4 8; do
    bench_line "flash warps $fw round $r" DORY_CUDA_FLASH_WARPS=$fw -m /tmp/dory4b -p 4096 -n 0 -r 1
  done
done
DORY_CUDA_FLASH_WARPS=8 timeout 100 build/tests/test_cuda_kernels > $OUT/kernels_fw8.txt 2>&1
echo "flash warps 8 kernel test: $(grep -E 'case\(s\)' $OUT/kernels_fw8.txt)" | tee -a $L
DORY_CUDA_FLASH_WARPS=8 DORY_BIN=build/dory timeout 100 python3 tests/gpu/test_gpu.py -v BuiltinModel.test_bf16_agreement > $OUT/gpu_fw8.txt 2>&1
echo "flash warps 8: $(grep -E 'agreement|^OK|FAIL' $OUT/gpu_fw8.txt | tr '\n' ' ')" | tee -a $L
DORY_CUDA_PROFILE=1 build/dory bench --device cuda -m /tmp/dory4b -p 4096 -n 0 -r 1 > $OUT/profile_pp4096.txt 2>&1
build/dory quantize /tmp/dory4b /tmp/q4.gguf --type q4_k_m -q
for sp in "" 32; do
  for d in 0 4096; do
    bench_line "q4 splits ${sp:-default} d$d" "DORY_CUDA_ATT_SPLITS=$sp" -m /tmp/q4.gguf -p 0 -n 64 -r 2 -d $d
  done
done
# CMF=1: scripts/dev/gpu_cmf.sh (the CMF dtypes' decode against the ggml types they run as,
# q8_2f's in-kernel quantizing), into this log.
if [ -n "${CMF:-}" ]; then
  OUT=$OUT L=$L bash scripts/dev/gpu_cmf.sh
fi

