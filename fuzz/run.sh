#!/usr/bin/env bash
# Runs one libFuzzer harness: fuzz/run.sh NAME [SECONDS] [BUILD_DIR]
# New inputs go to $FUZZ_WORK/NAME (default /tmp/dory-fuzz/NAME), seeded from
# fuzz/corpus/NAME; findings to $FUZZ_WORK/artifacts/NAME/. One process, lowest
# priority: the machine is shared (never run two at once, no -jobs/-workers).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"; secs="${2:-620}"; build="${3:-$here/../build-fuzz}"
work="${FUZZ_WORK:-/tmp/dory-fuzz}"
mkdir -p "$work/$name" "$work/artifacts/$name"
dict=()
[ -f "$here/dict/$name.dict" ] && dict=(-dict="$here/dict/$name.dict")
exec nice -n 19 "$build/fuzz/fuzz_$name" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/$name/" "${dict[@]}" \
  "$work/$name" "$here/corpus/$name"
