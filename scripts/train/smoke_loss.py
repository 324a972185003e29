#!/usr/bin/env python3
"""A training step's loss options on the CPU, before they cost GPU time: the built-in model's
shape with random weights, two rows of 256 tokens, every loss option of train.py (--aux1,
--aux-at, --exit-distill (-easy), --exit-calibrate, --bptt) at 1-4 passes; each loss must be finite,
larger than the plain loss where it adds a term, and give finite gradients. Needs torch (on
Debian 12: apt install python3-torch); exits 77 (skipped) without it.
    /usr/bin/python3 scripts/train/smoke_loss.py"""
import math
import os
import sys
import types

try:
    import torch
except ImportError:
    print("smoke_loss.py: skipped: no torch (apt install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
from dory_torch import Dory  # noqa: E402


def opts(**kw):
    a = dict(aux1=0.0, aux1_from=0.0, aux_at="", exit_distill=0.0, exit_distill_easy=0.0, exit_calibrate=0.0, hold=0.0, bptt=0)
    a.update(kw)
    return types.SimpleNamespace(**a)


def main():
    torch.manual_seed(0)
    model = Dory(train.CONFIG).to(train.DEV)
    g = torch.Generator(device=train.DEV)
    g.manual_seed(0)
    model.init_weights(generator=g)
    model.train()
    rows = torch.randint(0, 4096, (2, 257), device=train.DEV)
    weights = torch.ones(2, 256, device=train.DEV)
    cases = [("plain", opts()), ("--aux1 0.3", opts(aux1=0.3)),
             ("--aux-at 2:0.3,4:0.3", opts(aux_at="2:0.3,4:0.3")),
             ("--exit-distill 1.0", opts(exit_distill=1.0)),
             ("--exit-distill 1.0 --exit-distill-easy 0.5", opts(exit_distill=1.0, exit_distill_easy=0.5)),
             ("--exit-calibrate 1.0", opts(exit_calibrate=1.0)),
             ("--hold 1.0", opts(hold=1.0)),
             ("all, --bptt 2", opts(aux1=0.3, aux_at="2:0.3", exit_distill=1.0, exit_calibrate=1.0, hold=1.0,
                                      bptt=2))]
    bad = 0
    for loops in (1, 2, 3, 4):
        base = None
        for name, a in cases:
            aux_at = {int(k): float(w) for k, w in (x.split(":") for x in a.aux_at.split(",") if x)}
            torch.manual_seed(1)  # the same dropout draws for every case
            model.zero_grad(set_to_none=True)
            loss = train.step_loss(model, rows, weights, loops, a, aux_at, 1.0)
            loss.backward()
            gn = math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in model.parameters()
                               if p.grad is not None))
            v = float(loss)
            ok = math.isfinite(v) and math.isfinite(gn) and gn > 0
            if base is None:
                base = v
            elif loops > 1 and name != "plain" and not v >= base - 1e-6:
                ok = False  # every option adds a non-negative term where there is a second pass
            print("loops %d %-24s loss %.5f grad norm %.4f %s" % (loops, name, v, gn, "ok" if ok else "FAIL"))
            bad += not ok
    print("%s: %d case(s) failed" % ("OK" if not bad else "FAILED", bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
