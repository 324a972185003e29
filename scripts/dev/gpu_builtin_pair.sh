#!/usr/bin/env bash
# Stage 2 of the built-in model's recipe (scripts/train/train_builtin.sh, from the shipped
# weights) twice side by side on one GPU, with STAGE2 flags A and B; what comes back fits the
# run tool's eight files: $OUT/round.txt, $OUT/a/model.safetensors, $OUT/a/rest.tar (and b/).
#   bash scripts/dev/gpu_builtin_pair.sh MINUTES "STAGE2 FLAGS A" "STAGE2 FLAGS B"
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/round.txt
min=$1; shift
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
tags=(a b); i=0; pids=()
for fl in "$@"; do
  t=${tags[$i]}; i=$((i + 1))
  echo "== $(date +%T) $t: $fl" | tee -a $L
  (INIT=models/dory-mini STAGE2="$fl" timeout 580 bash scripts/train/train_builtin.sh /tmp/tb_$t 0 "$min" \
     > /tmp/tb_$t.out 2>&1) & pids+=($!)
done
wait "${pids[@]}"
for t in "${tags[@]:0:$i}"; do
  S=/tmp/tb_$t/stage2
  echo "== $t" | tee -a $L
  grep -E "weights from|eval step|val ppl|task acc|pass key at|trained|done in|Error|error" $S/log.txt | tail -24 | tee -a $L
  mkdir -p $OUT/$t
  [ -f $S/dory-mini/model.safetensors ] && mv $S/dory-mini/model.safetensors $OUT/$t/
  tar -C $S -cf $OUT/$t/rest.tar dory-mini dory-mini-ref.npz train_log.json log.txt 2>/dev/null
done
