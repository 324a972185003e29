#!/usr/bin/env bash
# The shortest device call that checks and times a round of CUDA work: the GPU tests (the 4B
# checkpoint made beside them), BF16 decode and prefill, Q4_K_M and Q8_0 decode, then 4B
# GPU-vs-CPU logits (one 100-row chunk; 24 rows one at a time). Everything is also appended
# to $OUT/quick.txt as it comes, so a call cut short still returns what it measured.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/quick.txt
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
stamp tests
DORY_BIN=build/dory timeout 200 python3 tests/gpu/test_gpu.py > $OUT/gpu_tests.txt 2>&1
grep -E "max\|d\||agreement|greedy|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -45 | tee -a $L
wait $ck
stamp bench
B() { build/dory bench --device cuda "$@" 2>&1 | grep -E "\| (pp|tg)[0-9]" | tee -a $L; }
B -m /tmp/dory4b -p 512 -n 64 -r 3
B -m /tmp/dory4b -p 4096 -n 0 -r 1
B -m /tmp/dory4b -p 0 -n 64 -r 3 --loops 1
B -m /tmp/dory4b -p 0 -n 64 -r 3 --loops 4
for t in q4_k_m q8_0; do
  build/dory quantize /tmp/dory4b /tmp/dory4b-$t.gguf --type $t -q
  B -m /tmp/dory4b-$t.gguf -p 512 -n 64 -r 3
done
stamp parity
ids=$(python3 -c "import numpy as np; print(','.join(map(str, np.random.default_rng(5).integers(0, 100000, 100))))")
d24=$(echo $ids | cut -d, -f1-24)
build/dory logits -m /tmp/dory4b --ids $ids --device cuda -o /tmp/g.npy > /dev/null 2>&1
build/dory logits -m /tmp/dory4b --ids $ids --device cpu -o /tmp/c.npy > /dev/null 2>&1
DORY_BF16_INPUT=float build/dory logits -m /tmp/dory4b --ids $d24 --chunk 1 --device cuda -o /tmp/gd.npy > /dev/null 2>&1
DORY_BF16_INPUT=float build/dory logits -m /tmp/dory4b --ids $d24 --chunk 1 --device cpu -o /tmp/cd.npy > /dev/null 2>&1
python3 -c "
import numpy as np
for a, b, what in (('/tmp/g.npy', '/tmp/c.npy', '4b prefill (100 rows, tensor cores) vs cpu'), ('/tmp/gd.npy', '/tmp/cd.npy', '4b decode (chunk 1, float inputs) vs cpu')):
    g = np.load(a); c = np.load(b); d = np.abs(g - c)
    print('%s: max|d| %.3e, rel %.3e, top-1 %.3f' % (what, d.max(), np.linalg.norm(g - c) / np.linalg.norm(c), (g.argmax(-1) == c.argmax(-1)).mean()))
" 2>&1 | tee -a $L
stamp done
