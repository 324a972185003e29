#!/usr/bin/env bash
# The prompt path on the GPU, in one device call: the GPU tests, GPU-vs-CPU logits of the
# Dory-4B shape over a 100-row chunk (tensor-core products and flash attention at head
# dimension 256), pp512 / pp4096, and a per-kernel profile of pp4096. Logs under $OUT.
#   scripts/dev/gpu_prefill.sh [tests] [parity] [bench] [profile]   (default: all)
set -uo pipefail
OUT=${OUT:-/tmp}
want=${*:-tests parity bench profile}
stamp() { echo "== $(date +%T) $*"; }
# The 4B checkpoint (~100 s of numpy) is made beside the tests.
ckpt_pid=
if [[ $want == *parity* || $want == *bench* || $want == *profile* ]] && [ ! -f /tmp/dory4b/config.json ]; then
  python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet & ckpt_pid=$!
fi
if [[ $want == *tests* ]]; then
  stamp tests
  DORY_BIN=build/dory timeout 300 python3 tests/gpu/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt" | grep -E "max\|d\||agreement|greedy|^Ran|^OK|FAIL|Error|error" | tail -40
fi
if [[ $want == *parity* || $want == *bench* || $want == *profile* ]]; then
  stamp checkpoint
  [ -n "$ckpt_pid" ] && wait $ckpt_pid
fi
if [[ $want == *parity* ]]; then
  stamp "4b parity, 100 rows in one chunk"
  ids=$(python3 -c "import numpy as np; print(','.join(map(str, np.random.default_rng(5).integers(0, 100000, 100))))")
  build/dory logits -m /tmp/dory4b --ids $ids --device cuda -o /tmp/g.npy 2>&1 | tail -1
  DORY_CUDA_TC=0 build/dory logits -m /tmp/dory4b --ids $ids --device cuda -o /tmp/n.npy 2>&1 | tail -1
  build/dory logits -m /tmp/dory4b --ids $ids --device cpu -o /tmp/c.npy 2>&1 | tail -1
  d20=$(echo $ids | cut -d, -f1-24)
  DORY_BF16_INPUT=float build/dory logits -m /tmp/dory4b --ids $d20 --chunk 1 --device cuda -o /tmp/gd.npy 2>&1 | tail -1
  DORY_BF16_INPUT=float build/dory logits -m /tmp/dory4b --ids $d20 --chunk 1 --device cpu -o /tmp/cd.npy 2>&1 | tail -1
  python3 -c "
import numpy as np; g=np.load('/tmp/g.npy'); n=np.load('/tmp/n.npy'); c=np.load('/tmp/c.npy')
for name, a in (('tensor cores', g), ('cuda cores', n)):
    d = np.abs(a - c); print('%s vs cpu: max|d| %.3e, rel %.3e, top-1 agree %.3f' % (name, d.max(), np.linalg.norm(a - c) / np.linalg.norm(c), (a.argmax(-1) == c.argmax(-1)).mean()))
a = np.load('/tmp/gd.npy'); c = np.load('/tmp/cd.npy'); d = np.abs(a - c)
print('decode (chunk 1, float inputs) vs cpu: max|d| %.3e, rel %.3e' % (d.max(), np.linalg.norm(a - c) / np.linalg.norm(c)))"
fi
if [[ $want == *bench* ]]; then
  stamp bench
  for p in 512 4096; do build/dory bench -m /tmp/dory4b --device cuda -p $p -n 64 -r 3 2>&1 | grep -E "pp$p|tg64" | tee -a $OUT/bench.txt; done
  DORY_CUDA_TC=0 build/dory bench -m /tmp/dory4b --device cuda -p 512 -n 0 -r 2 2>&1 | grep -E "pp512" | tee -a $OUT/bench.txt
  for l in 1 4; do build/dory bench -m /tmp/dory4b --device cuda -p 0 -n 64 -r 3 --loops $l 2>&1 | grep -E "tg64" | tee -a $OUT/bench.txt; done
  for t in q8_0 q4_k_m; do
    [ -f /tmp/dory4b-$t.gguf ] || build/dory quantize /tmp/dory4b /tmp/dory4b-$t.gguf --type $t -q
    build/dory bench -m /tmp/dory4b-$t.gguf --device cuda -p 512 -n 64 -r 3 2>&1 | grep -E "pp512|tg64" | tee -a $OUT/bench.txt
  done
fi
if [[ $want == *sanitize* ]]; then
  stamp sanitize
  python3 scripts/make_checkpoint.py --out /tmp/san --preset tiny --set hidden_size=256 --set intermediate_size=512 --set attention_head_dim=64 --seed 8 --quiet
  build/dory quantize /tmp/san /tmp/san-q4km.gguf --type q4_k_m -q
  ids=$(python3 -c "import numpy as np; print(','.join(map(str, np.random.default_rng(1).integers(0, 256, 80))))")
  for m in /tmp/san /tmp/san-q4km.gguf; do
    for ch in 64 1; do
      DORY_BF16_INPUT=bf16 DORY_CUDA_GRAPHS=0 compute-sanitizer --tool memcheck --print-limit 5 build/dory logits -m $m --ids $ids --chunk $ch --device cuda -o /tmp/s.npy 2>&1 | grep -E "ERROR SUMMARY|Invalid|out of bounds" | head -3
      DORY_BF16_INPUT=bf16 compute-sanitizer --tool racecheck --print-limit 5 build/dory logits -m $m --ids $ids --chunk $ch --device cuda -o /tmp/s.npy 2>&1 | grep -E "RACECHECK SUMMARY|hazard" | head -3
    done
  done
fi
if [[ $want == *profile* ]]; then
  stamp profile
  DORY_CUDA_PROFILE=1 build/dory bench -m /tmp/dory4b --device cuda -p 4096 -n 4 -r 1 > $OUT/prof4096.txt 2>&1
  grep prefill $OUT/prof4096.txt | head -14
fi
stamp done
