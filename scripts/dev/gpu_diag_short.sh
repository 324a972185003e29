#!/usr/bin/env bash
# The shortest diagnosis of the CUDA kernels (for a call with little device time left):
# the kernel unit test, then gpu_diag.py's quick sections. Output to $OUT/diag.txt.
set -uo pipefail
OUT=${OUT:-/tmp}
L=$OUT/diag.txt
echo "== kernels" >> $L
timeout 120 build/tests/test_cuda_kernels >> $L 2>&1
DORY_BIN=build/dory DIAG_SHORT=1 timeout 120 python3 scripts/dev/gpu_diag.py >> $L 2>&1
echo "== done" >> $L
