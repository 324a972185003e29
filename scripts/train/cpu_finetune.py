#!/usr/bin/env python3
"""A short fine-tune of a trained built-in model on the CPU, to see which way a loss option
moves the loop gain and the early-exit shares before it costs GPU time: the model's weights
(--init), windows of its training text tokenized by `dory tokenize`, `train.py`'s step loss
with the options given, loop counts drawn as the last stage of --loop-schedule; writes OUT
as a model directory (`dory ppl -m OUT`, `dory calibrate -m OUT`). Control runs: the same
command without the option, same --seed. Needs torch (Debian 12: python3-torch).
    /usr/bin/python3 scripts/train/cpu_finetune.py --out /tmp/ft_a --steps 150 [--exit-calibrate 1.0]"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
from dory_torch import Dory  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def token_stream(dory, model_dir, data, n_chars, cache):
    if os.path.exists(cache):
        return np.load(cache)
    docs = train.read_docs(os.path.join(data, "train.jsonl.gz"))
    random.Random(0).shuffle(docs)
    texts, total = [], 0
    for d in docs:
        texts.append(d["text"])
        total += len(d["text"])
        if total >= n_chars:
            break
    r = subprocess.run([dory, "tokenize", "-m", model_dir, "--jsonl", "-"],
                       input="".join(json.dumps(t) + "\n" for t in texts), capture_output=True, text=True,
                       check=True)
    ids = []
    for line in r.stdout.splitlines():
        ids.extend(json.loads(line))
        ids.append(train.EOT)
    a = np.asarray(ids, dtype=np.int64)
    np.save(cache, a)
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default=os.path.join(ROOT, "models", "dory-mini"))
    ap.add_argument("--data", default=os.path.join(ROOT, ".traindata"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dory", default=os.path.join(ROOT, "build", "dory"))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--loop-schedule", default="deep4", choices=sorted(train.LOOP_STAGES))
    ap.add_argument("--chars", type=int, default=4_000_000, help="training text to tokenize")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--aux1", type=float, default=0.0)
    ap.add_argument("--aux-at", default="")
    ap.add_argument("--exit-distill", type=float, default=0.0)
    ap.add_argument("--exit-distill-easy", type=float, default=0.0)
    ap.add_argument("--exit-calibrate", type=float, default=0.0)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--bptt", type=int, default=0)
    args = ap.parse_args()
    args.aux1_from = 0.0
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    stream = token_stream(args.dory, args.init, args.data, args.chars,
                          os.path.join(os.path.dirname(os.path.abspath(args.out)), "cpu_finetune_ids.npy"))
    print(f"{len(stream):,} training tokens", flush=True)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = train.load_weights(Dory(train.CONFIG), args.init)
    model.p_drop = args.dropout
    model.train()
    aux_at = {int(k): float(w) for k, w in (x.split(":") for x in args.aux_at.split(",") if x)}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    counts, cw = train.loop_choices_at(1, 1, args.loop_schedule)
    T, B = args.ctx, args.batch
    t0 = time.time()
    for step in range(args.steps):
        starts = [rng.randrange(0, len(stream) - T - 1) for _ in range(B)]
        rows = torch.as_tensor(np.stack([stream[s:s + T + 1] for s in starts]))
        weights = torch.ones(B, T)
        loops = rng.choices(counts, cw)[0]
        loss = train.step_loss(model, rows, weights, loops, args, aux_at, 1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for gr in opt.param_groups:
            gr["lr"] = args.lr * min(1.0, (step + 1) / 10)
        opt.step()
        if step % 25 == 0 or step + 1 == args.steps:
            print(f"step {step} loops {loops} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    for f in os.listdir(args.init):
        if f != "model.safetensors":
            shutil.copy(os.path.join(args.init, f), os.path.join(args.out, f))
    out = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    train.write_safetensors(os.path.join(args.out, "model.safetensors"), out)
    print(f"wrote {args.out} ({args.steps} steps, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
