#!/usr/bin/env bash
# gpu_diag.py plus compute-sanitizer (memcheck, racecheck) on a tiny tensor-core prompt;
# everything to $OUT/diag.txt as it comes.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/diag.txt
echo "== kernels" >> $L
timeout 200 build/tests/test_cuda_kernels >> $L 2>&1
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
DORY_BIN=build/dory timeout 300 python3 scripts/dev/gpu_diag.py >> $L 2>&1
python3 scripts/make_checkpoint.py --out /tmp/san --preset tiny --set attention_head_dim=64 --set hidden_size=256 --set intermediate_size=512 --quiet
ids=$(python3 -c "print(','.join(str(i) for i in range(3, 73)))")
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool" >> $L
  DORY_BF16_INPUT=bf16 timeout 120 compute-sanitizer --tool $tool --print-limit 5 build/dory logits -m /tmp/san --ids $ids --chunk 64 --device cuda -o /tmp/s.npy 2>&1 | tail -25 >> $L
done
echo "== done" >> $L
