#!/usr/bin/env bash
# Kernel times of decode without launch gaps: Nsight Compute on ~one token's launches of
# `dory bench -p 0` (graphs and PDL as in a real run; ncu serializes kernels, so this is each
# kernel's own duration and DRAM bytes), summed by kernel name. Run on the GPU machine.
#   scripts/dev/gpu_ncu.sh MODEL [SKIP] [COUNT]      (logs under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp}
M=$1; SKIP=${2:-1200}; COUNT=${3:-400}
ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  --launch-skip "$SKIP" --launch-count "$COUNT" \
  build/dory bench -m "$M" --device cuda -p 0 -n 8 -r 1 > "$OUT/ncu_raw.csv" 2> "$OUT/ncu_err.txt"
python3 - "$OUT/ncu_raw.csv" <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]; data = [r for r in rows[2:] if r[0].isdigit() or r[0].strip('"').isdigit()]
ki = head.index("Kernel Name"); ti = head.index("gpu__time_duration.sum"); bi = head.index("dram__bytes_read.sum")
units = rows[1]
tot = collections.defaultdict(lambda: [0, 0.0, 0.0])
for r in data:
    name = re.sub(r"\(.*", "", r[ki]).replace("dory::cuda::", "").replace("<unnamed>::", "")
    t = float(r[ti].replace(",", "")); b = float(r[bi].replace(",", ""))
    if units[ti].strip() == "nsecond": t /= 1e3
    elif units[ti].strip() == "msecond": t *= 1e3
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(units[bi].strip(), 1)
    e = tot[name]; e[0] += 1; e[1] += t; e[2] += b * scale
all_t = sum(v[1] for v in tot.values())
print("kernel | launches | total us | share | mean us | GB/s")
for k, (n, t, b) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print("%s | %d | %.1f | %.1f%% | %.2f | %.0f" % (k[:60], n, t, 100 * t / all_t, t / n, b / t / 1e3 if t else 0))
print("sum of kernel times: %.1f us over %d launches" % (all_t, sum(v[0] for v in tot.values())))
PY
