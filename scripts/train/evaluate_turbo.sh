#!/usr/bin/env bash
# Issue 29 points 4-6 on a trained model, through the engine, in one command (this machine,
# CPU): `dory calibrate` on the calibration text (its router line: the one-pass share within 1%
# by the router, the conf gate and the KL bound), early exit on held-out text
# (bench/gate_quality.py: one-pass share, KL, PPL cost per gate), prompt loops, pass-key
# retrieval with the far field and exact rows against exact attention, and o1 perplexity at
# 4k context. Writes OUT/turbo.gguf (default /tmp/dory-turbo-eval).
#   bash scripts/train/evaluate_turbo.sh [MODEL_DIR] [OUT]   (needs .traindata: prepare_data.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
M=${1:-models/dory-mini}
O=${2:-/tmp/dory-turbo-eval}
D=build/dory
mkdir -p "$O"
echo "== dory calibrate"
$D calibrate -m "$M" -f .traindata/calib.txt -o "$O/turbo.gguf" -t 2 2>&1 | grep -E "^router|^wrote"
echo "== early exit on held-out text (8 windows of 512 tokens)"
/usr/bin/python3 bench/gate_quality.py --dory $D -m "$O/turbo.gguf" \
  --gates off,conf:0.5,conf:0.7,conf:0.9,recon:0.0,recon:0.1,recon | tail -9
echo "== prompt loops (the unread half of each window at one pass)"
for p in 0 1; do
  $D ppl -m "$M" -f tests/data/dory-mini/loops_heldout.txt --ctx 512 --kv last_loop --prompt-loops $p -t 2 2>&1 |
    sed -n "s/.*Final estimate: \(PPL = [0-9.]*\).*/prompt loops $p: \1/p"
done
echo "== pass key: exact attention, then o1 + exact rows (the turbo file's defaults)"
/usr/bin/python3 scripts/train/passkey_eval.py --dory $D -m "$O/turbo.gguf" --lengths 1024,2048,4000 --trials 10 \
  -- --gate off --prompt-loops 0 -t 2 --o1 off | grep "^pass key"
/usr/bin/python3 scripts/train/passkey_eval.py --dory $D -m "$O/turbo.gguf" --lengths 1024,2048,4000 --trials 10 \
  -- --gate off --prompt-loops 0 -t 2 | grep "^pass key"
echo "== o1 perplexity at 4k context (the first 300 KB of .traindata/val.txt)"
head -c 300000 .traindata/val.txt > "$O/val300k.txt"
for o in off 32,128,4,512; do
  $D ppl -m "$M" -f "$O/val300k.txt" --ctx 4096 --kv last_loop --o1 $o -t 2 2>&1 |
    sed -n "s/.*Final estimate: \(PPL = [0-9.]*\).*/o1 $o: \1/p"
done
