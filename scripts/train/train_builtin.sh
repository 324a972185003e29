#!/usr/bin/env bash
# The built-in model's two-stage recipe as one command, on the GPU machine (from the repo
# root, with .traindata from prepare_data.py): stage 1 is the shipped 2026-12-06 run (`deep2`
# loop draws, task suite 1; retrieval appears there between steps 1,500 and 1,800), stage 2
# goes on from its weights with draws of 2-6 passes (`deep4`), task suite 3 and the extra
# STAGE2 flags. Writes OUT/stage1 and OUT/stage2 (train.py's outputs: dory-mini/,
# dory-mini-ref.npz, train_log.json, log.txt).
#   bash scripts/train/train_builtin.sh OUT [MINUTES1 [MINUTES2]]   (STAGE2="--aux1 0.3" ...)
# With INIT=DIR stage 1 is skipped and stage 2 starts from DIR (e.g. models/dory-mini, which
# is stage 1's output).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "$1"); m1=${2:-6.4}; m2=${3:-5.5}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
data() {  # DIR SUITE: the text data and the task suite SUITE's items
  mkdir -p "$1"
  for f in train.jsonl.gz val.jsonl.gz val.txt calib.txt; do
    [ -e .traindata/$f ] && ln -sf "$(realpath .traindata/$f)" "$1/$f"
  done
  /usr/bin/env python3 scripts/train/tasks.py --out "$1" --suite "$2" > /dev/null
}
init=${INIT:-}
if [ -z "$init" ]; then
  data "$OUT/data1" 1
  mkdir -p "$OUT/stage1"
  (cd scripts/train && python3 train.py --data "$OUT/data1" --out "$OUT/stage1" --minutes "$m1" --steps 100000 \
     --loop-schedule deep2 --task-suite 1 > "$OUT/stage1/log.txt" 2>&1)
  init=$OUT/stage1/dory-mini
fi
init=$(realpath "$init")
data "$OUT/data3" 3
mkdir -p "$OUT/stage2"
(cd scripts/train && python3 train.py --data "$OUT/data3" --out "$OUT/stage2" --init "$init" --minutes "$m2" \
   --steps 100000 --lr 6e-4 --loop-schedule deep4 --deep-weight 2 --task-suite 3 ${STAGE2:-} \
   > "$OUT/stage2/log.txt" 2>&1)
grep -E "val ppl|task acc|pass key at|done in" "$OUT/stage2/log.txt"
