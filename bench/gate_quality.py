#!/usr/bin/python3
"""Early exit: one-pass share against quality loss, and decode speed, on held-out text.

    /usr/bin/python3 bench/gate_quality.py --dory build/dory -m TURBO.gguf \\
        [--text .traindata/val.txt] [--windows 8] [--length 512] \\
        [--gates off,conf:0.5,conf:0.7,conf:0.9,recon:-0.05,recon,recon:0.05] [-t 2]

Every window of held-out tokens is decoded one token at a time (`dory logits --chunk 1`,
kv last_loop, the far field and exact rows off) once with no gate at the model's loop
count (the reference) and once per gate setting. Per setting it reports the share of
tokens that left after one pass, the mean KL divergence from the reference's next-token
distribution, the perplexity of the text, and the decode speed of those runs (tokens over
the wall time of the `dory logits` processes: each token is one decode step on real text;
the same load and file-writing overhead for every setting).
Needs numpy (Debian's /usr/bin/python3).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return r


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dory", default="build/dory")
    ap.add_argument("-m", "--model", required=True, help="a model with a router (dory calibrate) for recon gates")
    ap.add_argument("--text", default=".traindata/val.txt")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--gates", default="off,conf:0.5,conf:0.7,conf:0.9,recon:-0.05,recon,recon:0.05")
    ap.add_argument("-t", "--threads", default="2")
    a = ap.parse_args()

    with open(a.text, encoding="utf-8") as f:
        docs = [d.strip() for d in f.read().split("\n\n") if d.strip()]
    # Windows from consecutive documents: one long string, cut in token space.
    text = "\n\n".join(docs)
    ids = json.loads(run([a.dory, "tokenize", "-m", a.model, "--jsonl", "-"], input=json.dumps(text) + "\n")
                     .stdout.splitlines()[0])
    need = a.windows * a.length
    if len(ids) < need:
        sys.exit("%s: %d tokens, %d needed" % (a.text, len(ids), need))
    step = len(ids) // a.windows
    windows = [ids[i * step:i * step + a.length] for i in range(a.windows)]
    tmp = tempfile.mkdtemp(prefix="gate_quality_")
    common = ["--chunk", "1", "--kv", "last_loop", "--o1", "off", "--exact", "off", "--prompt-loops", "0",
              "-t", a.threads]

    def logits(w, gate):
        out = os.path.join(tmp, "l.npy")
        passes = os.path.join(tmp, "p.txt")
        t0 = time.monotonic()
        run([a.dory, "logits", "-m", a.model, "--ids", ",".join(map(str, w)), "-o", out, "--passes-out", passes,
             "--gate", gate] + common)
        wall[0] += time.monotonic() - t0
        with open(passes) as f:
            p = [int(x) for x in f.read().strip().split(",")]
        return np.load(out), np.array(p)

    wall = [0.0]

    ref = [logits(w, "off") for w in windows]
    print("| gate | one-pass share | mean KL to %d loops (nats) | perplexity | decode t/s |" % ref[0][1].max())
    print("| --- | ---: | ---: | ---: | ---: |")
    rows = []
    ref_nll = []
    for (lr, _), w in zip(ref, windows):
        ls = log_softmax(lr[:-1])
        ref_nll.append(-ls[np.arange(len(w) - 1), w[1:]])
    ref_ppl = float(np.exp(np.concatenate(ref_nll).mean()))
    for g in a.gates.split(","):
        one, kl, nll = [], [], []
        wall[0] = 0.0
        for (lr, _), w in zip(ref, windows):
            lg, p = logits(w, g)
            one.append((p == 1).mean())
            lp, lq = log_softmax(lr), log_softmax(lg)
            kl.append((np.exp(lp) * (lp - lq)).sum(axis=1).mean())
            nll.append(-lq[:-1][np.arange(len(w) - 1), w[1:]])
        tps = "%.0f" % (a.windows * a.length / wall[0])
        ppl = float(np.exp(np.concatenate(nll).mean()))
        print("| %s | %.3f | %.5f | %.2f | %s |" % (g, np.mean(one), np.mean(kl), ppl, tps), flush=True)
    print("\nreference perplexity (no gate, %d loops): %.2f over %d windows of %d tokens"
          % (ref[0][1].max(), ref_ppl, a.windows, a.length))


if __name__ == "__main__":
    main()
