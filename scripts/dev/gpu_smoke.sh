#!/usr/bin/env bash
# Every user-facing command once with --device cuda on the built-in model (run, chat, bench,
# ppl, logits, serve with two requests at once), for the GPU machine. Prints what each said.
set -uo pipefail
D=build/dory
$D run --device cuda -p "The king said" -n 16 --temp 0 2>&1 | tail -2
printf 'Tell me a fortune.\n' | $D chat --device cuda -n 24 -s 3 2>&1 | tail -3
$D bench --device cuda -p 64 -n 32 -r 2 2>&1 | grep -E "^\| dory|read bandwidth"
$D ppl --device cuda -f /usr/share/common-licenses/GPL-3 -c 512 --chunks 4 2>&1 | tail -2
$D ppl --device cpu -f /usr/share/common-licenses/GPL-3 -c 512 --chunks 4 2>&1 | tail -1
$D logits --device cuda --ids 1,2,3,4 -o /tmp/l.npy 2>&1 | tail -1
$D serve --device cuda --port 8097 --parallel 2 > /tmp/serve.log 2>&1 &
for i in $(seq 50); do curl -s localhost:8097/health | grep -q ok && break; sleep 0.2; done
for s in 1 2; do
  curl -s localhost:8097/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"The king said\", \"max_tokens\": 24, \"temperature\": 0, \"seed\": $s}" > /tmp/r$s.json &
done
wait %2 %3 2>/dev/null; sleep 0.5
cat /tmp/r1.json; echo; cat /tmp/r2.json; echo
curl -s localhost:8097/metrics | grep -E "kv_cache_bytes|batched" | head -3
kill %1; sleep 0.5; cat /tmp/serve.log
