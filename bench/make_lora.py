#!/usr/bin/python3
"""A random PEFT LoRA adapter for a Dory checkpoint, to measure what an adapter costs:
adapter_model.safetensors (F32 lora_A [r, in], lora_B [out, r], both small and random) and
adapter_config.json, for the matrices whose names end in the target modules.

    /usr/bin/python3 bench/make_lora.py --model models/dory-mini --out /tmp/lora16 --rank 16
    bench/ab.sh build/dory build/dory 6 -- -m models/dory-mini -p 0 -n 64 -r 1 -t 2   (with
      B_EXTRA="--lora /tmp/lora16": decode with the adapter against without, interleaved)
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "testlib"))
import st_np as ST  # noqa: E402

ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (model.safetensors)")
    ap.add_argument("--out", required=True, help="adapter directory to write")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=None, help="lora_alpha (default: the rank)")
    ap.add_argument("--targets", default=ALL, help="comma-separated module names (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    targets = a.targets.split(",")
    shapes = {}
    for f in sorted(os.listdir(a.model)):
        if f.endswith(".safetensors"):
            for name, (dt, shape, _) in ST.read(os.path.join(a.model, f)).items():
                mod = name[:-len(".weight")] if name.endswith(".weight") else None
                if mod and len(shape) == 2 and mod.split(".")[-1] in targets:
                    shapes[mod] = shape
    if not shapes:
        sys.exit("make_lora: no matrix of %s in %s" % (a.targets, a.model))
    rng = np.random.default_rng(a.seed)
    t = {}
    for mod, (out_dim, in_dim) in sorted(shapes.items()):
        t["base_model.model.%s.lora_A.weight" % mod] = (rng.standard_normal((a.rank, in_dim)) * 0.02).astype(np.float32)
        t["base_model.model.%s.lora_B.weight" % mod] = (rng.standard_normal((out_dim, a.rank)) * 0.02).astype(np.float32)
    os.makedirs(a.out, exist_ok=True)
    ST.write_f32(os.path.join(a.out, "adapter_model.safetensors"), t)
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": a.rank, "lora_alpha": a.alpha or float(a.rank),
                   "target_modules": targets}, f)
    n = sum(v.size for v in t.values())
    print("wrote %s: rank %d on %d matrices, %d parameters (%.1f MB in f32)" % (a.out, a.rank, len(shapes), n, 4e-6 * n))


if __name__ == "__main__":
    main()
