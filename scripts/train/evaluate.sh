#!/usr/bin/env bash
# Issue 29's measurements of a trained model, through the engine, in one command (this
# machine, CPU): held-out perplexity at loops 1-4 (the fixed file tests/builtin checks), the
# task suite at loops 1/2/4, the share of English words `dory run` writes, and pass-key
# retrieval. Prints each table as it comes.
#   bash scripts/train/evaluate.sh [MODEL_DIR]   (default models/dory-mini; needs .traindata
#   from prepare_data.py and tasks.py for the tasks and pass keys)
set -euo pipefail
cd "$(dirname "$0")/../.."
M=${1:-models/dory-mini}
D=build/dory
echo "== held-out PPL (tests/data/dory-mini/loops_heldout.txt, --ctx 512)"
for l in 1 2 3 4; do
  p=$($D ppl -m "$M" -f tests/data/dory-mini/loops_heldout.txt --ctx 512 --loops $l -t 2 2>&1 |
      sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  echo "loops $l: $p"
done
echo "== task suite (400 held-out items)"
/usr/bin/python3 scripts/train/task_eval.py -m "$M" --n 400 --dory "$D" | tail -8
echo "== English share of dory run (no chat)"
/usr/bin/python3 scripts/train/english_share.py --dory "$D" --seeds 5 -n 200 -m "$M" | tail -1
echo "== pass key (exact attention)"
/usr/bin/python3 scripts/train/passkey_eval.py --dory "$D" -m "$M" --lengths 1024,2048,4000 --trials 10 -- -t 2
