#!/usr/bin/env bash
# The device call's carry, compressed: the tracked tree is ~47 MB and the run tool carries at
# most 64 MiB, so build/dory, the kernel test and the shared libraries the GPU machine lacks
# (.devlibs: pcre2, utf8proc, cpp-httplib, ssl, brotli) go as xz files under build/carry.
#   bash scripts/dev/pack_carry.sh
# then run(carry=["build/carry"], command="bash scripts/dev/unpack_carry.sh && export
# LD_LIBRARY_PATH=$PWD/.devlibs; bash scripts/dev/gpu_quick.sh > /dev/null 2>&1; cat $OUT/quick.txt")
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/carry
xz -T0 -6 -c build/dory > build/carry/dory.xz
[ -x build/tests/test_cuda_kernels ] && xz -T0 -6 -c build/tests/test_cuda_kernels > build/carry/tk.xz
[ -d .devlibs ] && tar cJf build/carry/devlibs.tar.xz .devlibs
du -sh build/carry/*
