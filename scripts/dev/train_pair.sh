#!/bin/bash
# One or two training configurations on one GPU (two side by side, each at about half the
# throughput), logs and outputs under $OUT/a (and $OUT/b). Usage (on the GPU machine, from the
# repo root):
#   scripts/dev/train_pair.sh MINUTES "ARGS A" ["ARGS B"]
set -u
min=$1; shift
tags=(a b)
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
cd scripts/train
i=0
for args in "$@"; do
  tag=${tags[$i]}; i=$((i + 1))
  mkdir -p "$OUT/$tag"
  echo "$args" > "$OUT/$tag/args.txt"
  python3 train.py --data ../../.traindata --out "$OUT/$tag" --minutes "$min" --steps 100000 \
    $args > "$OUT/$tag/log.txt" 2>&1 &
done
wait
for tag in "${tags[@]:0:$i}"; do tar -C "$OUT" -cf "$OUT/$tag.tar" $tag/dory-mini $tag/dory-mini-ref.npz $tag/train_log.json 2>/dev/null && rm -rf "$OUT/$tag/dory-mini" "$OUT/$tag/dory-mini-ref.npz"; echo "== $tag: $(cat $OUT/$tag/args.txt)"; grep -E "eval step|val ppl|task acc|pass key at|kept|trained|done in|Error" "$OUT/$tag/log.txt" | tail -22; done
