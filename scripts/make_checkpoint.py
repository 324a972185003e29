#!/usr/bin/python3
"""Make a random-weight Dory checkpoint in the Hugging Face layout.

Writes DIR/config.json and DIR/model.safetensors (or, with --shards N,
DIR/model-0000i-of-0000N.safetensors plus DIR/model.safetensors.index.json).
Tensors are exactly those of docs/model.md section 1; values are random but scaled so the
forward pass is numerically interesting (see `Init` below).

Usage:
  /usr/bin/python3 scripts/make_checkpoint.py --out DIR [--preset tiny|4b]
      [--set key=JSONVALUE ...] [--drop KEY ...] [--seed N]
      [--dtype bf16|f16|f32] [--shards N] [--dry-run]

Only the standard library and numpy. Weights are streamed to disk tensor by
tensor in chunks, so the 4B preset (~8 GB in bf16) never sits in memory.
"""

import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np

# ---------------------------------------------------------------------------
# Presets

FIXED_KEYS = {
    "model_type": "dory",
    "architectures": ["DoryForCausalLM"],
    "dory_format_version": 1,
    "ngpt": True,
    "fngpt": True,
    "ngpt_enable_final_norm": False,
    "attention_output_gate": True,
    "mlp_hidden_act": "silu",
    "mlp_bias": False,
    "attention_bias": False,
    "initial_state": "input_copy",
    "input_transform": "residual",
    "output_transform": "replace",
    "mixer_type": None,
    "tie_word_embeddings": False,
}

PRESETS = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_head_dim": 16,
        "vocab_size": 256,
        "num_hidden_layers": 12,
        # Every block (input 0-3, recurrent 4-7, output 8-11) holds an S and a * layer.
        "hybrid_layer_pattern": "S-*-*-S-S-*-",
        "n_input_layers": 4,
        "n_recurrent_layers": 4,
        "n_output_layers": 4,
        "n_recurrent_loops": 2,
        "recurrent_kv_cache_mode": "per_loop",
        "swa_window_size": 4,
        "rope_theta": 10000.0,
        "rope_theta_2": 500000.0,
        "partial_rotary_factor": 1.0,
        "partial_rotary_factor_2": 1.0,
        "init_method_std": 0.02,
        "ngpt_alpha_init": 0.05,
        "attention_output_gate_logit_scale_init": None,
        "max_position_embeddings": 256,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "4b": {
        "hidden_size": 2560,
        "intermediate_size": 7168,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "attention_head_dim": 256,
        "vocab_size": 131072,
        "num_hidden_layers": 72,
        "hybrid_layer_pattern": "S-S-S-*-" * 9,
        "n_input_layers": 16,
        "n_recurrent_layers": 40,
        "n_output_layers": 16,
        "n_recurrent_loops": 2,
        "recurrent_kv_cache_mode": "per_loop",
        "swa_window_size": 1024,
        "rope_theta": 10000.0,
        "rope_theta_2": 1000000.0,
        "partial_rotary_factor": 1.0,
        "partial_rotary_factor_2": 1.0,
        "init_method_std": 0.02,
        "ngpt_alpha_init": 0.05,
        "attention_output_gate_logit_scale_init": None,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}

ELEMENTS_4B = 3975229440  # docs/model.md section 1


def default_rope_profiles(preset, pattern):
    """Per-layer rope profile (1 -> rope_theta, 2 -> rope_theta_2)."""
    if preset == "4b":
        # Full layers on the long-range theta, sliding layers on the short one.
        return [2 if c == "*" else 1 for c in pattern]
    # tiny: alternate over attention layers so both S and * layers get both profiles.
    out, k = [], 0
    for c in pattern:
        if c == "-":
            out.append(1)
        else:
            out.append(2 if k % 2 else 1)
            k += 1
    return out


def build_config(preset, sets, drops, dtype):
    cfg = dict(PRESETS[preset])
    base_pattern = cfg["hybrid_layer_pattern"]
    given = set(sets)
    cfg.update(sets)

    # Keep the per-layer structure consistent with whatever was overridden.
    if "hybrid_layer_pattern" in given and "num_hidden_layers" not in given:
        cfg["num_hidden_layers"] = len(cfg["hybrid_layer_pattern"])
    L = cfg["num_hidden_layers"]
    if "hybrid_layer_pattern" not in given and len(cfg["hybrid_layer_pattern"]) != L:
        cfg["hybrid_layer_pattern"] = (base_pattern * (L // len(base_pattern) + 1))[:L]
    counts = ("n_input_layers", "n_recurrent_layers", "n_output_layers")
    if sum(cfg[k] for k in counts) != L:
        if "n_recurrent_layers" not in given:
            cfg["n_recurrent_layers"] = L - cfg["n_input_layers"] - cfg["n_output_layers"]
        elif "n_output_layers" not in given:
            cfg["n_output_layers"] = L - cfg["n_input_layers"] - cfg["n_recurrent_layers"]
        elif "n_input_layers" not in given:
            cfg["n_input_layers"] = L - cfg["n_recurrent_layers"] - cfg["n_output_layers"]
        if min(cfg[k] for k in counts) < 0:
            sys.exit("make_checkpoint: layer counts %s do not fit num_hidden_layers=%d"
                     % ([cfg[k] for k in counts], L))
    if "rope_profile_layers" not in given:
        cfg["rope_profile_layers"] = default_rope_profiles(preset, cfg["hybrid_layer_pattern"])
    # head_dim and attention_head_dim are the same thing; keep them equal unless both given.
    if "head_dim" in given and "attention_head_dim" not in given:
        cfg["attention_head_dim"] = cfg["head_dim"]
    if "head_dim" not in given:
        cfg["head_dim"] = cfg["attention_head_dim"]

    out = dict(FIXED_KEYS)
    out["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    for k, v in cfg.items():
        if k not in FIXED_KEYS or k in given:
            out[k] = v
    for k in given:
        out[k] = sets[k]
    for k in drops:
        out.pop(k, None)
    return out


def config_text(cfg):
    """config.json text: indented, with short lists (architectures, profiles) on one line."""
    lines = ["{"]
    items = list(cfg.items())
    for j, (k, v) in enumerate(items):
        comma = "," if j + 1 < len(items) else ""
        lines.append("  %s: %s%s" % (json.dumps(k), json.dumps(v), comma))
    return "\n".join(lines) + "\n}\n"


# ---------------------------------------------------------------------------
# Tensor list and random init


def tensor_specs(cfg):
    """[(name, shape, kind)] in file order; kind selects the init rule."""
    H = cfg["hidden_size"]
    F = cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nk = cfg["num_key_value_heads"]
    hd = cfg["attention_head_dim"]
    V = cfg["vocab_size"]
    specs = [("backbone.embeddings.weight", (V, H), "embed")]
    for i, c in enumerate(cfg["hybrid_layer_pattern"]):
        p = "backbone.layers.%d." % i
        if c in "S*":
            specs += [
                (p + "mixer.q_proj.weight", (nh * hd, H), "matrix"),
                (p + "mixer.k_proj.weight", (nk * hd, H), "matrix"),
                (p + "mixer.v_proj.weight", (nk * hd, H), "matrix"),
                (p + "mixer.g_proj.weight", (nh * hd, H), "matrix"),
                (p + "mixer.o_proj.weight", (H, nh * hd), "matrix"),
                (p + "mixer.sqk", (nh * hd,), "sqk"),
                (p + "mixer.s_gate", (nh * hd,), "s_gate"),
                (p + "attn_alpha", (H,), "alpha"),
            ]
        elif c == "-":
            specs += [
                (p + "mixer.gate_proj.weight", (F, H), "matrix"),
                (p + "mixer.up_proj.weight", (F, H), "matrix"),
                (p + "mixer.down_proj.weight", (H, F), "matrix"),
                (p + "mixer.suv_gate", (F,), "suv"),
                (p + "mixer.suv_up", (F,), "suv"),
                (p + "mlp_alpha", (H,), "alpha"),
            ]
        else:
            sys.exit("make_checkpoint: hybrid_layer_pattern char %r at layer %d" % (c, i))
    specs += [
        ("lm_head.weight", (V, H), "matrix"),
        ("lm_head.logit_scale", (V,), "logit_scale"),
    ]
    return specs


def signs(rng, n):
    return np.where(rng.random(n) < 0.5, -1.0, 1.0)


class Init:
    """Random values, in float32, for one tensor kind.

    The targets (what the engine actually computes with) are:
      matrices            ~ N(0, sigma^2)  -> W x has std ~sigma for a unit-norm x
      embeddings          rows ~ N(0, 1/H) * U[0.5, 3]: row norms 0.5..3, so layer 0
                          really sees an un-normalized row
      alpha               |alpha * a0 / sigma| = U[0.05, 0.6], random sign
      sqk                 (sqk*sqrt(hd)/sigma)^2 = hd * U[1, 5]: attention scores
                          q.k/sqrt(hd) of std ~2-3 (not uniform, not one-hot)
      s_gate              (s_gate*sqrt(g0)/sigma)^2 = U[0.5, 2.5]/sigma: gate logits ~1
      suv                 suv*sqrt(H) = +-U[0.5, 2.5]/sigma: SiLU inputs of order 1
                          (in its curved part, not the linear one around 0)
      logit_scale         logit_scale = U[1.0, 2.5]: logits of std ~1.8, max |logit| ~5-8
    Every scale vector has per-element jitter so elementwise bugs show.
    """

    def __init__(self, cfg):
        self.sigma = float(cfg["init_method_std"])
        self.a0 = float(cfg["ngpt_alpha_init"])
        self.H = int(cfg["hidden_size"])
        self.hd = int(cfg["attention_head_dim"])
        g0 = cfg.get("attention_output_gate_logit_scale_init")
        self.g0 = math.sqrt(self.H) if g0 is None else float(g0)

    def vector(self, kind, rng, n):
        s = self.sigma
        if kind == "alpha":
            v = rng.uniform(0.05, 0.6, n) * s / self.a0 * signs(rng, n)
        elif kind == "sqk":
            eff = self.hd * rng.uniform(1.0, 5.0, n)
            v = np.sqrt(eff) * s / math.sqrt(self.hd) * signs(rng, n)
        elif kind == "s_gate":
            eff = rng.uniform(0.5, 2.5, n) / s
            v = np.sqrt(eff) * s / math.sqrt(self.g0) * signs(rng, n)
        elif kind == "suv":
            v = rng.uniform(0.5, 2.5, n) / s / math.sqrt(self.H) * signs(rng, n)
        elif kind == "logit_scale":
            v = rng.uniform(1.0, 2.5, n)
        else:
            raise ValueError(kind)
        return v.astype(np.float32)

    def chunks(self, name, shape, kind, seed, chunk_elems):
        """Yield float32 arrays whose concatenation is the tensor (row-major).

        Each tensor has its own generator seeded by (seed, crc32(name)), so values do
        not depend on tensor order, sharding or chunk size.
        """
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if len(shape) == 1:
            yield self.vector(kind, rng, shape[0])
            return
        rows, cols = shape
        step = max(1, chunk_elems // cols)
        for r0 in range(0, rows, step):
            r = min(step, rows - r0)
            x = rng.standard_normal((r, cols), dtype=np.float32)
            if kind == "embed":
                x *= np.float32(1.0 / math.sqrt(cols))
                x *= rng.uniform(0.5, 3.0, (r, 1)).astype(np.float32)
            else:
                x *= np.float32(self.sigma)
            yield x


# ---------------------------------------------------------------------------
# safetensors writing

ST_DTYPE = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}


def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))
    return (b >> np.uint32(16)).astype(np.uint16)


def encode(x, dtype):
    if dtype == "bf16":
        return to_bf16_bits(x).astype("<u2").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    return x.astype("<f4").tobytes()


def header_bytes(specs, dtype):
    st, size = ST_DTYPE[dtype]
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, _ in specs:
        n = size * int(np.prod(shape))
        hdr[name] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * ((-len(js)) % 8)
    return len(js).to_bytes(8, "little") + js, off


def split_shards(specs, n, elem_size):
    """Cut the tensor list into n contiguous groups of roughly equal bytes."""
    sizes = [elem_size * int(np.prod(s)) for _, s, _ in specs]
    total = sum(sizes)
    groups, cur, acc = [], [], 0
    for spec, sz in zip(specs, sizes):
        cur.append(spec)
        acc += sz
        left_groups = n - len(groups) - 1
        if left_groups > 0 and acc >= total * (len(groups) + 1) / n:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    while len(groups) < n:  # more shards than tensors can fill: never for real configs
        big = max(range(len(groups)), key=lambda g: len(groups[g]))
        if len(groups[big]) < 2:
            sys.exit("make_checkpoint: cannot cut %d tensors into %d shards" % (len(specs), n))
        groups.insert(big + 1, groups[big][1:])
        groups[big] = groups[big][:1]
    return groups


def write_tensor(job):
    """Writes one tensor's bytes at its offset in a file already at its full size."""
    path, off, name, shape, kind, seed, chunk_elems, dtype, cfg = job
    init = Init(cfg)
    fd = os.open(path, os.O_WRONLY)
    try:
        for x in init.chunks(name, shape, kind, seed, chunk_elems):
            b = encode(x, dtype)
            os.pwrite(fd, b, off)
            off += len(b)
    finally:
        os.close(fd)
    return int(np.prod(shape))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a config key with a JSON value (repeatable)")
    ap.add_argument("--drop", action="append", default=[], metavar="KEY",
                    help="leave KEY out of config.json (tests the defaults)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(ST_DTYPE), default="bf16")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--chunk-elems", type=int, default=1 << 22, help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true",
                    help="print tensor count, elements and bytes; write nothing")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    sets = {}
    for s in args.set:
        if "=" not in s:
            sys.exit("make_checkpoint: --set wants KEY=JSONVALUE, got %r" % s)
        k, v = s.split("=", 1)
        try:
            sets[k] = json.loads(v)
        except json.JSONDecodeError as e:
            sys.exit("make_checkpoint: --set %s: value %r is not JSON (%s); quote strings "
                     "like '\"last_loop\"'" % (k, v, e))
    cfg = build_config(args.preset, sets, args.drop, args.dtype)
    specs = tensor_specs(cfg)
    st, esize = ST_DTYPE[args.dtype]
    n_elems = sum(int(np.prod(s)) for _, s, _ in specs)
    n_bytes = n_elems * esize
    if args.shards < 1:
        sys.exit("make_checkpoint: --shards must be >= 1")
    groups = [specs] if args.shards == 1 else split_shards(specs, args.shards, esize)
    names = (["model.safetensors"] if args.shards == 1 else
             ["model-%05d-of-%05d.safetensors" % (i + 1, args.shards) for i in range(args.shards)])
    headers = [header_bytes(g, args.dtype) for g in groups]
    file_bytes = sum(len(h) + n for h, n in headers)

    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    log("tensors: %d  elements: %d  data bytes: %d  file bytes: %d  dtype: %s  files: %d"
        % (len(specs), n_elems, n_bytes, file_bytes, st, len(names)))
    for nm, (h, n) in zip(names, headers):
        log("  %s: header %d bytes, data %d bytes" % (nm, len(h), n))
    if args.preset == "4b" and not sets and not args.drop:
        ok = n_elems == ELEMENTS_4B
        log("4B element count check: %d %s %d" % (n_elems, "==" if ok else "!=", ELEMENTS_4B))
        if not ok:
            sys.exit("make_checkpoint: 4B element count is wrong")
    if args.dry_run:
        return

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        f.write(config_text(cfg))
    # Remove files of an earlier layout so a reader never picks up a stale one.
    for old in os.listdir(args.out):
        if old.endswith(".safetensors") or old == "model.safetensors.index.json":
            if old not in names:
                os.remove(os.path.join(args.out, old))

    t0 = time.time()
    # Every tensor has its own generator (Init.chunks), so tensors can be written in any order:
    # large checkpoints are made by a process per core, each writing its tensors at their
    # offsets in the file (the bytes are the same as one process writes; the 4B preset takes
    # ~100 s in one, seconds on 16 cores).
    jobs = []
    for nm, g, (hdr, n) in zip(names, groups, headers):
        path = os.path.join(args.out, nm)
        with open(path + ".tmp", "wb") as f:
            f.write(hdr)
            f.truncate(len(hdr) + n)
        off = len(hdr)
        for name, shape, kind in g:
            jobs.append((path + ".tmp", off, name, shape, kind, args.seed, args.chunk_elems, args.dtype, cfg))
            off += esize * int(np.prod(shape))
    procs = min(os.cpu_count() or 1, len(jobs)) if n_bytes >= (256 << 20) else 1
    done = 0
    next_report = 0.0
    if procs > 1:
        import multiprocessing
        with multiprocessing.Pool(procs) as pool:
            results = pool.imap_unordered(write_tensor, sorted(jobs, key=lambda j: -int(np.prod(j[3]))))
            for elems in results:
                done += elems
                if done / n_elems >= next_report and n_elems > 50_000_000:
                    log("  %5.1f%%  %d/%d elements  %.0fs  (%d processes)" % (
                        100 * done / n_elems, done, n_elems, time.time() - t0, procs))
                    while next_report <= done / n_elems:
                        next_report += 0.1
    else:
        for job in jobs:
            done += write_tensor(job)
    for nm in names:
        path = os.path.join(args.out, nm)
        os.replace(path + ".tmp", path)
    if args.shards > 1:
        index = {"metadata": {"total_size": n_bytes},
                 "weight_map": {name: nm for nm, g in zip(names, groups) for name, _, _ in g}}
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    log("wrote %s in %.1fs" % (args.out, time.time() - t0))


if __name__ == "__main__":
    main()
