#!/usr/bin/env bash
# The shortest device call that checks and times a round of CUDA work: the GPU tests (the 4B
# checkpoint made beside them), BF16 decode and prefill, tensor cores against CUDA cores on
# one 100-row chunk of the 4B shape (head dimension 256), Q4_K_M and Q8_0 decode, loops 1
# and 4. Everything is appended to $OUT/quick.txt as it comes, so a call cut short still
# returns what it measured.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/quick.txt
stamp() { echo "== $(date +%T) $*" | tee -a $L; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ck=$!
stamp kernels
[ -x build/tests/test_cuda_kernels ] && timeout 120 build/tests/test_cuda_kernels > $OUT/kernels.txt 2>&1; tail -1 $OUT/kernels.txt | tee -a $L
stamp tests
DORY_BIN=build/dory timeout 200 python3 tests/gpu/test_gpu.py > $OUT/gpu_tests.txt 2>&1
grep -E "max\|d\||agreement|decode:|prompt,|spread|greedy|^Ran|^OK|FAIL|Error|error" $OUT/gpu_tests.txt | tail -45 | tee -a $L
wait $ck
stamp bench
B() { build/dory bench --device cuda "$@" 2>&1 | grep -E "\| (pp|tg)[0-9]" | tee -a $L; }
B -m /tmp/dory4b -p 512 -n 64 -r 2
ids=$(python3 -c "import numpy as np; print(','.join(map(str, np.random.default_rng(5).integers(0, 100000, 100))))")
build/dory logits -m /tmp/dory4b --ids $ids --device cuda -o /tmp/g.npy > /dev/null 2>&1
DORY_CUDA_TC=0 build/dory logits -m /tmp/dory4b --ids $ids --device cuda -o /tmp/n.npy > /dev/null 2>&1
python3 -c "
import numpy as np
g = np.load('/tmp/g.npy'); c = np.load('/tmp/n.npy'); d = np.abs(g - c)
print('4b, 100 rows: tensor cores vs CUDA cores (both bf16 inputs): max|d| %.3e, rel %.3e, top-1 %.3f' % (d.max(), np.linalg.norm(g - c) / np.linalg.norm(c), (g.argmax(-1) == c.argmax(-1)).mean()))
" 2>&1 | tee -a $L
B -m /tmp/dory4b -p 4096 -n 0 -r 1
build/dory quantize /tmp/dory4b /tmp/dory4b-q4_k_m.gguf --type q4_k_m -q
B -m /tmp/dory4b-q4_k_m.gguf -p 0 -n 64 -r 2
B -m /tmp/dory4b -p 0 -n 64 -r 2 --loops 1
B -m /tmp/dory4b -p 0 -n 64 -r 2 --loops 4
build/dory quantize /tmp/dory4b /tmp/dory4b-q8_0.gguf --type q8_0 -q
B -m /tmp/dory4b-q8_0.gguf -p 0 -n 64 -r 2
stamp "a/b: fusions off, flash off"
DORY_CUDA_FUSE=0 B -m /tmp/dory4b -p 0 -n 64 -r 2
DORY_CUDA_FLASH=0 B -m /tmp/dory4b -p 4096 -n 0 -r 1
stamp done
