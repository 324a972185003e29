#!/usr/bin/env bash
# One device call for a round when the machine is scarce: a training run (train_pair.sh, one
# configuration, in the background) while the kernel test and the GPU tests run beside it,
# then the decode benches and the int8 A/B once the GPU is free. Logs under $OUT (summary in
# $OUT/round.txt). Two configurations train side by side (each at about half the throughput).
#   bash scripts/dev/gpu_round_train.sh MINUTES "TRAIN ARGS A" ["TRAIN ARGS B"]
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/round.txt
min=${1:-4.0}; shift; targs=("$@")
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
stamp "training ($min min: ${targs[*]}) in the background"
(timeout 500 bash scripts/dev/train_pair.sh "$min" "${targs[@]}" > $OUT/train_summary.txt 2>&1) & tr=$!
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
stamp kernels
timeout 120 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1
grep -E "FAIL|decode, norm|swiglu_quant|case\(s\)" $OUT/kernels.txt | tee -a $L
stamp tests
DORY_BIN=build/dory timeout 240 python3 tests/gpu/test_gpu.py > $OUT/gpu_tests.txt 2>&1
grep -E "max\|d\||agreement|decode:|prompt,|spread|greedy|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -45 | tee -a $L
stamp "FLASH_F16=0"
DORY_CUDA_FLASH_F16=0 DORY_BIN=build/dory timeout 60 python3 tests/gpu/test_gpu.py BuiltinModel.test_bf16_agreement BuiltinModel.test_prompts_on_tensor_cores > $OUT/f16.txt 2>&1
grep -E "agreement|^OK|FAIL|Ran" $OUT/f16.txt | tee -a $L
wait $ck
build/dory quantize /tmp/dory4b /tmp/q4.gguf --type q4_k_m -q
build/dory quantize /tmp/dory4b /tmp/q8.gguf --type q8_0 -q
stamp "waiting for training"
wait $tr
cat $OUT/train_summary.txt >> $L
stamp bench
B() { build/dory bench --device cuda "$@" 2>&1 | grep -E "\| (pp|tg)[0-9]" | tee -a $L; }
B -m /tmp/dory4b -p 0 -n 64 -r 2
L=$L bash scripts/dev/gpu_int8_ab.sh
B -m /tmp/dory4b -p 4096 -n 0 -r 1
stamp done
