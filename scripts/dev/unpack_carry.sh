#!/usr/bin/env bash
# On the GPU machine: what pack_carry.sh packed, back in place.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/tests
xz -dc build/carry/dory.xz > build/dory && chmod +x build/dory
if [ -f build/carry/tk.xz ]; then xz -dc build/carry/tk.xz > build/tests/test_cuda_kernels && chmod +x build/tests/test_cuda_kernels; fi
if [ -f build/carry/devlibs.tar.xz ]; then tar xJf build/carry/devlibs.tar.xz; fi
