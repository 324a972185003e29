#!/usr/bin/env python3
"""GPU against CPU on the built-in model, for diagnosing differences: KL and top-1 of
dory logits under both devices, with and without bf16-rounded inputs, at chunk 64 (CPU
batches on vdpbf16ps) and chunk 1 (CPU single rows on float kernels); and the greedy text.
    python3 scripts/dev/gpu_diag.py   (on the GPU machine, from the repo root)"""
import json, subprocess, os, sys
import numpy as np
D = "build/dory"; M = "models/dory-mini"
text = open("/usr/share/common-licenses/GPL-3").read()
ids = json.loads(subprocess.run([D, "tokenize", "-m", M, "--jsonl", "-"], input=json.dumps(text) + "\n",
                                capture_output=True, text=True).stdout)[:512]
def lg(dev, env, *fl):
    e = dict(os.environ); e.update(env)
    r = subprocess.run([D, "logits", "-m", M, "--ids", ",".join(map(str, ids)), "-o", "/tmp/x.npy", "--device", dev, *fl],
                       env=e, capture_output=True, text=True)
    if r.returncode: print(r.stderr); sys.exit(1)
    return np.load("/tmp/x.npy").astype(np.float64)
def cmp(a, b, name):
    la = a - a.max(1, keepdims=True); la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b - b.max(1, keepdims=True); lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    kl = (np.exp(la) * (la - lb)).sum(1).mean(); t = (a.argmax(1) == b.argmax(1)).mean()
    print("%-40s top1 %.4f KL %.2e maxdiff %.2e" % (name, t, kl, np.abs(a - b).max()), flush=True)
F = {"DORY_BF16_INPUT": "float"}
cmp(lg("cuda", F), lg("cpu", F), "float, chunk 64: gpu vs cpu")
cmp(lg("cuda", {}), lg("cpu", {}), "default, chunk 64: gpu vs cpu")
cmp(lg("cuda", {}, "--chunk", "1"), lg("cpu", {}, "--chunk", "1"), "default, chunk 1: gpu vs cpu")
for env, name in ((F, "float"), ({}, "default")):
    outs = []
    for dev in ("cuda", "cpu"):
        e = dict(os.environ); e.update(env)
        outs.append(subprocess.run([D, "run", "-p", "The king said", "-n", "64", "--temp", "0", "--ignore-eos",
                                    "--device", dev], env=e, capture_output=True, text=True).stdout)
    same = next((i for i in range(min(map(len, outs))) if outs[0][i] != outs[1][i]), None)
    print("greedy 64, %s: %s" % (name, "same" if outs[0] == outs[1] else "differ at char %s" % same))
