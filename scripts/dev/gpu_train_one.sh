#!/usr/bin/env bash
# One training configuration alone on the GPU (full throughput), or two side by side (each at
# about half), then the GPU tests of the int8 paths and the decode/prompt benches once it is
# done. What comes back fits the run tool's eight files: $OUT/round.txt (summary),
# $OUT/gpu_tests.txt, and per run $OUT/a/model.safetensors and $OUT/a/rest.tar (the model's
# other files, its reference logits, the log and train_log.json; the second run under b/).
#   [BENCH=0] bash scripts/dev/gpu_train_one.sh MINUTES "TRAIN ARGS" ["TRAIN ARGS B"]
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/round.txt
min=$1; shift
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
train() {  # TAG ARGS
  local W=/tmp/train_$1; mkdir -p $W $OUT/$1
  (cd scripts/train && PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 timeout 560 \
    python3 train.py --data ../../.traindata --out $W --minutes "$min" --steps 100000 $2 > $W/log.txt 2>&1)
  [ -f $W/dory-mini/model.safetensors ] && mv $W/dory-mini/model.safetensors $OUT/$1/
  echo "$2" > $W/args.txt
  tar -C $W -cf $OUT/$1/rest.tar dory-mini dory-mini-ref.npz train_log.json log.txt args.txt 2>/dev/null
}
tags=(a b); i=0; pids=()
for targs in "$@"; do
  stamp "training ${tags[$i]} ($min min: $targs)"
  train ${tags[$i]} "$targs" & pids+=($!); i=$((i + 1))
done
wait "${pids[@]}"
for t in "${tags[@]:0:$i}"; do
  echo "== $t: $(cat /tmp/train_$t/args.txt)" | tee -a $L
  grep -E "eval step|val ppl|task acc|pass key at|kept|trained|done in|Error|error" /tmp/train_$t/log.txt | tail -30 | tee -a $L
done
wait $ck
[ "${BENCH:-1}" = 1 ] || { stamp "done (BENCH=0: no tests or benches)"; exit 0; }
stamp tests
DORY_BIN=build/dory timeout 150 python3 tests/gpu/test_gpu.py BuiltinModel.test_int8_tensor_core_prompts \
  BuiltinModel.test_int8_decode_fusions BuiltinModel.test_q8_0_agreement BuiltinModel.test_k_quant_agreement \
  BuiltinModel.test_greedy_run_is_the_same > $OUT/gpu_tests.txt 2>&1
grep -E "agreement|decode:|prompt:|spread|greedy|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -20 | tee -a $L
stamp bench
build/dory quantize /tmp/dory4b /tmp/q4.gguf --type q4_k_m -q
build/dory quantize /tmp/dory4b /tmp/q8.gguf --type q8_0 -q
B() { build/dory bench --device cuda "$@" 2>&1 | grep -E "\| (pp|tg)[0-9]" | tee -a $L; }
for m in /tmp/dory4b /tmp/q8.gguf /tmp/q4.gguf; do for l in 2 1 4; do B -m $m -p 0 -n 64 -r 2 --loops $l; done; done
for m in /tmp/q8.gguf /tmp/q4.gguf; do for p in 512 4096; do B -m $m -p $p -n 0 -r 1; done; done
stamp done
