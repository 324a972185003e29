#!/usr/bin/python3
"""Load test and throughput curve for `dory serve` (loopback only, bounded in time and count).

  # 32 streaming clients for 5 minutes: long and short prompts, chat and completions,
  # cancellations (clients that hang up mid-stream or while queued):
  bench/serve_load.py load --dory build/dory -m MODEL --clients 32 --seconds 300 -- --parallel 8 -t 2

  # aggregate tokens/s for 1, 2, 4, 8 concurrent streaming clients:
  bench/serve_load.py curve --dory build/dory -m MODEL --clients 1,2,4,8 --seconds 60 -- --parallel 8 -t 2

Arguments after `--` go to `dory serve`. The server is started on a free loopback port and
stopped at the end (SIGTERM; its exit code is checked). Aggregate tokens/s comes from the
server's own counter (/metrics dory_generated_tokens_total) over the measured window; time to
first token (TTFT) is measured by the clients, from sending the request to the first content.
The server's RSS is sampled from /proc every 5 s. Without --dory/-m, --url names a running
server (127.0.0.1 or localhost only).
"""

import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.parse

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "serve"))
from serverlib import Server, metrics, request  # noqa: E402

WORDS = ("the king said that every river runs to the sea and no one knows why the stars are cold "
         "while a small boat waits in the harbour for morning light and old songs").split()


def text_of(n_words, rng):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = 0
        self.cancelled = 0
        self.failed = []
        self.ttft = []  # seconds, requests that got content
        self.tokens = 0  # completion_tokens of finished requests

    def fail(self, why):
        with self.lock:
            self.failed.append(why)


def one_request(port, body, chat, cancel_after_chunks, cancel_after_s, stats, timeout=600):
    """One streaming request; returns nothing, records into stats."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    data = json.dumps(dict(body, stream=True, stream_options={"include_usage": True})).encode()
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
    except (OSError, http.client.HTTPException) as e:
        return stats.fail("connect/send: %r" % e)
    try:
        if r.status != 200:
            return stats.fail("HTTP %d: %s" % (r.status, r.read()[:200]))
        chunks, first, done, finish, usage = 0, None, False, None, None
        for raw in r:
            if cancel_after_s is not None and time.time() - t0 > cancel_after_s:
                break
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            ev = json.loads(payload)
            if "error" in ev:
                return stats.fail("stream error: %s" % ev["error"])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("text") if not chat else (ch.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.time() - t0
                    chunks += 1
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if cancel_after_chunks is not None and chunks >= cancel_after_chunks:
                break
        cancelled = not done and (cancel_after_chunks is not None or cancel_after_s is not None)
        if cancelled:
            with stats.lock:
                stats.cancelled += 1
                if first is not None:
                    stats.ttft.append(first)
            return
        if not done:
            return stats.fail("stream ended without [DONE]")
        if finish not in ("stop", "length"):
            return stats.fail("finish_reason %r" % finish)
        if usage is None or usage["completion_tokens"] > body["max_tokens"]:
            return stats.fail("bad usage %r" % usage)
        with stats.lock:
            stats.ok += 1
            stats.tokens += usage["completion_tokens"]
            if first is not None:
                stats.ttft.append(first)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return stats.fail("read: %r" % e)
    finally:
        c.close()  # a cancelled client just hangs up, as a browser tab would


def run_load(port, pid, args):
    rng0 = random.Random(args.seed)
    system = "You are a helpful assistant. " + text_of(60, rng0)  # a shared prefix: slot reuse
    stats = Stats()
    stop_at = time.time() + args.seconds
    budget = [args.max_requests]
    budget_lock = threading.Lock()
    rss = []  # (t, KiB)

    def client(i):
        rng = random.Random(args.seed * 1000 + i)
        while time.time() < stop_at:
            with budget_lock:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
            kind = rng.random()
            n_words = rng.randint(args.long_words // 2, args.long_words) if kind < 0.2 else rng.randint(3, 40)
            chat = rng.random() < 0.5
            body = {"max_tokens": rng.choice([8, 16, 32, 64, 128, 256]), "temperature": 0.8,
                    "seed": rng.randint(0, 1 << 30)}
            if chat:
                body["messages"] = [{"role": "system", "content": system},
                                    {"role": "user", "content": text_of(n_words, rng)}]
            else:
                body["prompt"] = text_of(n_words, rng)
            c = rng.random()
            cancel_chunks = rng.randint(1, 20) if c < 0.10 else None
            cancel_s = rng.uniform(0.01, 1.0) if 0.10 <= c < 0.15 else None  # often while queued
            one_request(port, body, chat, cancel_chunks, cancel_s, stats)

    t_start = time.time()
    m0 = metrics(port)
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    kv = []  # (t, KiB of KV cache capacity, from /metrics), beside the RSS samples

    def kv_kib():
        try:
            return metrics(port)["dory_kv_cache_bytes"] / 1024
        except Exception:  # noqa: BLE001 (a sample lost under load is not a failure)
            return None

    while any(t.is_alive() for t in threads):
        now = time.time() - t_start
        rss.append((now, rss_kib(pid)))
        kv.append((now, kv_kib()))
        for t in threads:
            t.join(timeout=max(0.0, 5.0 / len(threads)))
    wall = time.time() - t_start
    m1 = metrics(port)
    rss.append((wall, rss_kib(pid)))
    status, _, _ = request(port, "GET", "/health")
    gen = m1["dory_generated_tokens_total"] - m0["dory_generated_tokens_total"]
    steps = m1["dory_batch_steps_total"] - m0["dory_batch_steps_total"]
    rows = m1["dory_batch_decode_rows_total"] - m0["dory_batch_decode_rows_total"]
    after_warm = [k for t, k in rss if t >= args.warmup and k]
    total = stats.ok + stats.cancelled + len(stats.failed)
    print("## load: %d clients, %.0f s, `dory serve %s`" % (args.clients, wall, " ".join(args.serve_args)))
    print("requests        %d (%d completed, %d cancelled by the client, %d FAILED)" %
          (total, stats.ok, stats.cancelled, len(stats.failed)))
    for why in stats.failed[:10]:
        print("  failure:", why)
    print("TTFT            p50 %.3f s, p90 %.3f s, p99 %.3f s, max %.3f s (%d requests with content)" %
          (percentile(stats.ttft, 50), percentile(stats.ttft, 90), percentile(stats.ttft, 99),
           max(stats.ttft) if stats.ttft else float("nan"), len(stats.ttft)))
    print("tokens/s        %.1f aggregate (server counter: %d tokens in %.0f s)" % (gen / wall, gen, wall))
    print("batch           %.2f decode rows per step (%d steps)" % (rows / steps if steps else 0, steps))
    print("prompt tokens   %d fed, %d from slot caches" % (
        m1["dory_prompt_tokens_total"] - m0["dory_prompt_tokens_total"],
        m1["dory_prompt_tokens_cached_total"] - m0["dory_prompt_tokens_cached_total"]))
    if after_warm:
        print("RSS             %.1f MiB after %d s warm-up, %.1f MiB at the end, max %.1f MiB (min %.1f)" %
              (after_warm[0] / 1024, args.warmup, after_warm[-1] / 1024, max(after_warm) / 1024,
               min(after_warm) / 1024))
    print("RSS samples     " + " ".join("%d:%.0f" % (t, k / 1024) for t, k in rss[::max(1, len(rss) // 20)] if k))
    # The KV caches grow (never shrink) until each slot has held its longest request, so
    # what must stay flat is the rest: RSS minus the KV capacity the server reports.
    rest = [(t, r - k) for (t, r), (_, k) in zip(rss, kv) if t >= args.warmup and r and k is not None]
    if rest:
        print("RSS - KV        %.1f MiB after warm-up, %.1f MiB at the end, max %.1f MiB, min %.1f MiB" %
              (rest[0][1] / 1024, rest[-1][1] / 1024, max(r for _, r in rest) / 1024,
               min(r for _, r in rest) / 1024))
        print("KV samples      " + " ".join("%d:%.0f" % (t, k / 1024) for t, k in kv[::max(1, len(kv) // 20)] if k is not None))
    print("health after    %d" % status)
    return len(stats.failed) == 0 and status == 200


def run_curve(port, pid, args):
    ns = [int(x) for x in args.clients.split(",")]
    print("## curve: `dory serve %s`, max_tokens %d, measured %d s after %d s warm-up" %
          (" ".join(args.serve_args), args.max_tokens, args.seconds, args.warmup))
    print("| clients | aggregate tokens/s | per client | decode rows/step | forward ms/step | forward share | "
          "TTFT p50 | TTFT p99 | requests |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ok = True
    for n in ns:
        stats = Stats()
        stop_at = time.time() + args.warmup + args.seconds

        def client(i):
            rng = random.Random(args.seed * 7919 + i)
            while time.time() < stop_at:
                body = {"prompt": text_of(args.prompt_words, rng), "max_tokens": args.max_tokens,
                        "ignore_eos": True, "temperature": 0.8, "seed": rng.randint(0, 1 << 30)}
                one_request(port, body, False, None, None, stats)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        m0, t0 = metrics(port), time.time()
        time.sleep(args.seconds)
        m1, t1 = metrics(port), time.time()
        for t in threads:
            t.join()
        gen = m1["dory_generated_tokens_total"] - m0["dory_generated_tokens_total"]
        steps = m1["dory_batch_steps_total"] - m0["dory_batch_steps_total"]
        rows = m1["dory_batch_decode_rows_total"] - m0["dory_batch_decode_rows_total"]
        busy = m1["dory_busy_seconds_total"] - m0["dory_busy_seconds_total"]
        tps = gen / (t1 - t0)
        print("| %d | %.1f | %.1f | %.2f | %.2f | %.0f%% | %.3f s | %.3f s | %d ok, %d failed |" %
              (n, tps, tps / n, rows / steps if steps else 0, 1000 * busy / steps if steps else 0,
               100 * busy / (t1 - t0), percentile(stats.ttft, 50), percentile(stats.ttft, 99), stats.ok,
               len(stats.failed)), flush=True)
        ok &= not stats.failed
    return ok


def main():
    argv = sys.argv[1:]
    serve_args = []
    if "--" in argv:
        serve_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["load", "curve"])
    ap.add_argument("--dory", help="the dory binary (starts a server)")
    ap.add_argument("-m", "--model", help="model for the started server")
    ap.add_argument("--url", help="a running server instead (loopback only)")
    ap.add_argument("--clients", default="32", help="load: concurrent clients; curve: a list like 1,2,4,8")
    ap.add_argument("--seconds", type=float, default=300, help="load: duration; curve: measured window per step")
    ap.add_argument("--warmup", type=float, default=30, help="seconds before RSS/throughput count")
    ap.add_argument("--max-requests", type=int, default=200000, help="load: upper bound on requests")
    ap.add_argument("--long-words", type=int, default=1200, help="load: words in a long prompt (at most)")
    ap.add_argument("--prompt-words", type=int, default=12, help="curve: words per prompt")
    ap.add_argument("--max-tokens", type=int, default=64, help="curve: tokens per request")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    args.serve_args = serve_args
    if args.mode == "load":
        args.clients = int(args.clients)
    args.seconds = min(args.seconds, 3600)  # bounded, whatever the flags say

    srv = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        if u.hostname not in ("127.0.0.1", "localhost"):
            sys.exit("serve_load.py: loopback servers only (got %s)" % u.hostname)
        port, pid = u.port, None
    else:
        if not args.dory or not args.model:
            sys.exit("serve_load.py: give --dory BIN -m MODEL, or --url")
        srv = Server(args.dory, args.model, *serve_args, timeout=300)
        port, pid = srv.port, srv.proc.pid
    print("machine: %s, %d cores; load average before: %s" % (
        open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(),
        os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])))
    try:
        ok = run_load(port, pid, args) if args.mode == "load" else run_curve(port, pid, args)
    finally:
        print("load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
        if srv:
            rc = srv.stop(signal.SIGTERM, timeout=60)
            print("server exit code %d; last lines:\n  %s" % (rc, "\n  ".join(srv.stderr().strip().splitlines()[-2:])))
            ok &= rc == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
