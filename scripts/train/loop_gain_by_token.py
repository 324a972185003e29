#!/usr/bin/env python3
"""Where the loops' gain goes, token by token: the training code's float32 forward of a model
directory (default: the shipped built-in model) on windows of a held-out file at 1-4 passes;
prints PPL per pass count, the NLL difference against two passes by the tokens' NLL quartile
at two passes and by position in the window, and the mean NLL with the logits divided by a few
temperatures (is a pass count only calibrated differently?). Needs torch (python3-torch).
    /usr/bin/python3 scripts/train/loop_gain_by_token.py [MODEL_DIR] [--windows 12]"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
from dory_torch import Dory  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "models", "dory-mini"))
    ap.add_argument("--file", default=os.path.join(ROOT, "tests", "data", "dory-mini", "loops_heldout.txt"))
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--dory", default=os.path.join(ROOT, "build", "dory"))
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    text = open(args.file, encoding="utf-8").read()
    r = subprocess.run([args.dory, "tokenize", "-m", args.model, "--jsonl", "-"], input=json.dumps(text) + "\n",
                       capture_output=True, text=True, check=True)
    ids = np.array(json.loads(r.stdout.splitlines()[0]))
    W = 512  # a multiple of the sliding window (the training code's full-sequence attention)
    n = min(args.windows, len(ids) // (W + 1))
    rows = torch.as_tensor(ids[: n * (W + 1)].reshape(n, W + 1))
    model = train.load_weights(Dory(train.CONFIG), args.model)
    model.eval()
    taus = (0.9, 1.0, 1.1, 1.2)
    nll = {}
    with torch.no_grad():
        for loops in (1, 2, 3, 4):
            per_tau = {t: [] for t in taus}
            for b in range(0, n, 4):
                x = rows[b:b + 4]
                lg = model(x[:, :-1], loops, dtype=torch.float32).reshape(-1, model.cfg.V)
                for t in taus:
                    per_tau[t].append(F.cross_entropy(lg / t, x[:, 1:].reshape(-1), reduction="none"))
            nll[loops] = torch.cat(per_tau[1.0]).view(n, W).numpy()
            temps = " ".join(f"/{t}: {torch.cat(per_tau[t]).mean().item():.4f}" for t in taus)
            print(f"{loops} passes: PPL {np.exp(nll[loops].mean()):.2f}; mean NLL with logits {temps}")
    q = np.quantile(nll[2], [0, 0.25, 0.5, 0.75, 1])
    for i in range(4):
        m = (nll[2] >= q[i]) & (nll[2] <= q[i + 1])
        d = "  ".join(f"{k} - 2: {(nll[k] - nll[2])[m].mean():+.4f}" for k in (1, 3, 4))
        print(f"quartile {i + 1} by NLL at 2 passes (mean {nll[2][m].mean():.3f}): {d}")
    pos = np.arange(W)[None, :].repeat(n, 0)
    for lo, hi in ((0, 16), (16, 64), (64, 256), (256, W)):
        m = (pos >= lo) & (pos < hi)
        print(f"positions {lo}-{hi}: 4 - 2: {(nll[4] - nll[2])[m].mean():+.4f}")


if __name__ == "__main__":
    main()
