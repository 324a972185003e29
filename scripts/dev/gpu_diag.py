#!/usr/bin/env python3
"""One device call that tells which new CUDA kernel is wrong: logits of the same ids with
tensor cores + flash attention (default), tensor-core products only (DORY_CUDA_FLASH=0) and
CUDA cores only (DORY_CUDA_TC=0), each against the CPU, on checkpoints of head dimension 16
to 256; the K-type decode kernels on the built-in model (top-1 agreement, KL against the CPU)
and on a 256-wide random checkpoint (against the CPU's own kernel-set spread).
    DORY_BIN=build/dory python3 scripts/dev/gpu_diag.py > $OUT/diag.txt"""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DORY = os.environ.get("DORY_BIN", os.path.join(ROOT, "build", "dory"))
TMP = tempfile.mkdtemp(prefix="diag_")
BF = {"DORY_BF16_INPUT": "bf16"}
FLOAT = {"DORY_BF16_INPUT": "float"}


def ckpt(name, *sets, seed=0):
    out = os.path.join(TMP, name)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", out, "--preset", "tiny",
           "--seed", str(seed), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True)
    return out


def logits(model, ids, device, *flags, env=None):
    out = os.path.join(TMP, "l.npy")
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([DORY, "logits", "-m", model, "--ids", ",".join(map(str, ids)), "-o", out, "--device", device,
                        *flags], capture_output=True, text=True, env=e)
    if r.returncode:
        return None, r.stderr.strip()[-300:]
    return np.load(out), ""


def show(label, a, b):
    if a is None or b is None:
        print("  %-60s FAILED" % label, flush=True)
        return
    d = np.abs(a - b)
    print("  %-60s max|d| %.3e  rel %.3e  top-1 %.3f" % (label, d.max(), np.linalg.norm(a - b) / np.linalg.norm(b),
                                                       (a.argmax(-1) == b.argmax(-1)).mean()), flush=True)


def tc_matrix(model, n, chunk, vocab):
    ids = np.random.default_rng(1).integers(0, vocab, n).tolist()
    c, _ = logits(model, ids, "cpu", "--chunk", chunk, env=BF)
    for label, env in (("tc+flash", {}), ("tc only (FLASH=0)", {"DORY_CUDA_FLASH": "0"}),
                       ("cuda cores (TC=0)", {"DORY_CUDA_TC": "0"})):
        g, err = logits(model, ids, "cuda", "--chunk", chunk, env=dict(BF, **env))
        if err:
            print("   ", err)
        show("%s chunk %s n %d: %s" % (os.path.basename(model), chunk, n, label), g, c)


SHORT = os.environ.get("DIAG_SHORT") == "1"
print("== tensor cores: which kernel", flush=True)
for hd, extra in ((16, []),) + (() if SHORT else ((32, []),)) + ( (64, ["hidden_size=256", "intermediate_size=512"]),
                  (128, ["hidden_size=256", "intermediate_size=512"]), (256, ["hidden_size=256", "intermediate_size=512"])):
    m = ckpt("hd%d" % hd, "attention_head_dim=%d" % hd, *extra)
    for chunk in (("64",) if SHORT else ("16", "64")):
        tc_matrix(m, 70, chunk, 256)
# full attention only (no window) at hd 64 and 256: the window's part told apart
for hd in (() if SHORT else (64, 256)):
    m = ckpt("full%d" % hd, "attention_head_dim=%d" % hd, "hidden_size=256", "intermediate_size=512",
             "swa_window_size=4096")
    tc_matrix(m, 70, "64", 256)
if os.path.isdir("/tmp/dory4b") and not SHORT:
    tc_matrix("/tmp/dory4b", 100, "512", 100000)


def kl_top1(g, c):
    g, c = g.astype(np.float64), c.astype(np.float64)
    lp = c - c.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    lq = g - g.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    return (g.argmax(1) == c.argmax(1)).mean(), (np.exp(lp) * (lp - lq)).sum(1).mean()


print("== built-in BF16, default inputs, 2 windows of 1024: gpu vs cpu", flush=True)
mini = os.path.join(ROOT, "models", "dory-mini")
text = open("/usr/share/common-licenses/GPL-3" if os.path.exists("/usr/share/common-licenses/GPL-3")
            else os.path.join(ROOT, "README.md")).read()
r = subprocess.run([DORY, "tokenize", "-m", mini, "--jsonl", "-"], input=__import__("json").dumps(text) + "\n",
                   capture_output=True, text=True, check=True)
held = [int(x) for x in r.stdout.strip()[1:-1].split(",")][:2048]
cpus = [logits(mini, held[w * 1024:(w + 1) * 1024], "cpu")[0] for w in range(2)]
for label, env in (("tc+flash", {}), ("FLASH_F16=0", {"DORY_CUDA_FLASH_F16": "0"}), ("FLASH=0", {"DORY_CUDA_FLASH": "0"}),
                   ("TC=0", {"DORY_CUDA_TC": "0"})):
    t1, kl = [], []
    for w in range(2):
        g, _ = logits(mini, held[w * 1024:(w + 1) * 1024], "cuda", env=env)
        a, k = kl_top1(g, cpus[w])
        t1.append(a), kl.append(k)
    print("  %-10s top-1 %.4f  KL %.2e" % (label, np.mean(t1), np.mean(kl)), flush=True)

print("== K types", flush=True)
mini = os.path.join(ROOT, "models", "dory-mini")
ids = np.random.default_rng(3).integers(0, 4096, 300).tolist()
for t in (("q4_k_m", "q6_k") if SHORT else ("q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0")):
    out = os.path.join(TMP, "mini-%s.gguf" % t)
    subprocess.run([DORY, "quantize", mini, out, "--type", t, "-q"], check=True, capture_output=True)
    for chunk in (("1", "512") if SHORT else ("1", "7", "512")):
        g, _ = logits(out, ids[:100] if chunk == "1" else ids, "cuda", "--chunk", chunk, env=FLOAT)
        c, _ = logits(out, ids[:100] if chunk == "1" else ids, "cpu", "--chunk", chunk, env=dict(FLOAT, DORY_ISA="scalar"))
        show("mini %s chunk %s gpu vs cpu scalar" % (t, chunk), g, c)
    c2, _ = logits(out, ids, "cpu", "--chunk", "512", env=FLOAT)
    c3, _ = logits(out, ids, "cpu", "--chunk", "512", env=dict(FLOAT, DORY_ISA="scalar"))
    show("mini %s chunk 512 cpu default vs cpu scalar (spread)" % t, c2, c3)
