#!/usr/bin/python3
"""Float64 numpy reference of the Dory forward pass (docs/model.md sections 1 and 2).

This is the oracle the C++ engine is tested against: it is written for clarity,
straight from the formulas, and computes everything in float64.

Library:
    import dory_ref
    logits = dory_ref.run(model_dir, ids, loops=None, kv=None, chunk=None,
                          chunks=None, loops_per_chunk=None,
                          o1=None)   # [len(ids), V] float64; o1 = (m, w, sink, seal)

CLI:
    /usr/bin/python3 scripts/reference/dory_ref.py --model DIR --ids 1,2,3
        [--loops N] [--kv per_loop|last_loop] [--chunk K | --chunks 3,1,4]
        [--loops-per-chunk 2,1,2] [--o1 m,w,sink,seal [--o1-clamp]] -o OUT.npy

Defaults: loops = config n_recurrent_loops; kv = config recurrent_kv_cache_mode
(itself "per_loop" when absent); one chunk holding the whole sequence.

Only the standard library and numpy.
"""

import argparse
import json
import math
import os

import numpy as np

EPS = 1e-6

# ---------------------------------------------------------------------------
# Checkpoint reading


def _read_safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header, 8 + n


def _to_f64(raw, dtype, shape):
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
        x = bits.view(np.float32)
    elif dtype == "F16":
        x = np.frombuffer(raw, dtype="<f2")
    elif dtype == "F32":
        x = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F64":
        x = np.frombuffer(raw, dtype="<f8")
    else:
        raise ValueError("unsupported safetensors dtype %s" % dtype)
    return x.astype(np.float64).reshape(shape)


class Weights:
    """All tensors of a checkpoint (single file or sharded), as float64 on demand."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.where = {}  # name -> (memmap, dtype, shape, begin, end)
        for fn in files:
            path = os.path.join(model_dir, fn)
            header, base = _read_safetensors_header(path)
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                if name in self.where:
                    raise ValueError("tensor %s appears twice" % name)
                b, e = meta["data_offsets"]
                self.where[name] = (mm, meta["dtype"], tuple(meta["shape"]), base + b, base + e)
        total = sum(e - b for (_, _, _, b, e) in self.where.values())
        self.keep = total < (1 << 30)  # small models: convert once and keep
        self.cache = {}

    def __contains__(self, name):
        return name in self.where

    def shape(self, name):
        return self.where[name][2]

    def __getitem__(self, name):
        if name in self.cache:
            return self.cache[name]
        mm, dtype, shape, b, e = self.where[name]
        x = _to_f64(mm[b:e].tobytes(), dtype, shape)
        if self.keep:
            self.cache[name] = x
        return x

    def rows(self, name, idx):
        """Selected rows of a 2-D tensor (the embedding lookup)."""
        if self.keep:
            return self[name][idx]
        mm, dtype, shape, b, e = self.where[name]
        esize = (e - b) // int(np.prod(shape))
        row = shape[1] * esize
        return np.stack([_to_f64(mm[b + i * row:b + (i + 1) * row].tobytes(), dtype, shape[1:])
                         for i in idx])


# ---------------------------------------------------------------------------
# Config


REQUIRED_VALUES = {
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


class Config:
    """The config keys the forward pass reads, with vLLM's defaults for absent ones."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        for key, want in REQUIRED_VALUES.items():
            if key in c and c[key] != want:
                raise ValueError("config.json: %s is %r, Dory requires %r" % (key, c[key], want))
        self.H = c["hidden_size"]
        self.F = c["intermediate_size"]
        self.nh = c["num_attention_heads"]
        self.nk = c["num_key_value_heads"]
        self.hd = c.get("attention_head_dim", c.get("head_dim"))
        if "head_dim" in c and c["head_dim"] != self.hd:
            raise ValueError("config.json: head_dim %r != attention_head_dim %r"
                             % (c["head_dim"], self.hd))
        self.V = c["vocab_size"]
        self.L = c["num_hidden_layers"]
        self.pattern = c.get("hybrid_layer_pattern") or "S-S-S-*-" * (self.L // 8)
        self.n_in = c.get("n_input_layers", 0)
        self.n_out = c.get("n_output_layers", 0)
        self.n_rec = c.get("n_recurrent_layers")
        if self.n_rec is None:
            self.n_rec = self.L - self.n_in - self.n_out
        self.loops = c.get("n_recurrent_loops", 1)
        self.kv_mode = c.get("recurrent_kv_cache_mode", "per_loop")
        self.W = c.get("swa_window_size", 1024)
        theta1 = c.get("rope_theta", 10000)
        theta2 = c.get("rope_theta_2")
        prf1 = c.get("partial_rotary_factor", 1.0)
        prf2 = c.get("partial_rotary_factor_2")
        self.theta = {1: theta1, 2: theta1 if theta2 is None else theta2}
        self.rotary = {1: int(self.hd * prf1), 2: int(self.hd * (prf1 if prf2 is None else prf2))}
        self.profile = c.get("rope_profile_layers") or [1] * self.L
        self.sigma = c.get("init_method_std", 0.02)
        self.a0 = c.get("ngpt_alpha_init", 0.05)
        g0 = c.get("attention_output_gate_logit_scale_init")
        self.g0 = math.sqrt(self.H) if g0 is None else g0

        if len(self.pattern) != self.L or set(self.pattern) - set("S*-"):
            raise ValueError("config.json: hybrid_layer_pattern must have one S, * or - per layer")
        if self.n_in + self.n_rec + self.n_out != self.L:
            raise ValueError("config.json: n_input/n_recurrent/n_output_layers must sum to L")
        if len(self.profile) != self.L or set(self.profile) - {1, 2}:
            raise ValueError("config.json: rope_profile_layers must hold 1 or 2 per layer")
        if self.nh % self.nk:
            raise ValueError("config.json: num_attention_heads %% num_key_value_heads != 0")
        for r in self.rotary.values():
            if r <= 0 or r % 2 or r > self.hd:
                raise ValueError("config.json: rotary dims %d not positive, even, <= head_dim" % r)


# ---------------------------------------------------------------------------
# Forward pass


def n(x):
    """nGPT norm over the last dimension: x / sqrt(sum x^2 + eps)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + EPS)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope(x, pos, theta, r):
    """NeoX-style RoPE on the first r dims of every head: pairs (j, j + r/2).

    x: [t, heads, hd]; pos: [t]. Dims >= r are left untouched.
    """
    half = r // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / r)          # [half]
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [t, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:r]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:r] = b * cos + a * sin
    return out


class Cache:
    """K and V rows of one attention cache slot, indexed by absolute position."""

    def __init__(self, total, nk, hd):
        self.k = np.full((total, nk, hd), np.nan)
        self.v = np.full((total, nk, hd), np.nan)


def ridge_pinv(A, lam0=1e-6):
    """(A^T A + lam I)^-1 A^T, lam = lam0 * mean diag(A^T A), x10 until Cholesky works."""
    G = A.T @ A
    md = np.trace(G) / G.shape[0]
    lam = lam0 * md
    while lam <= 1e6 * md:
        try:
            L = np.linalg.cholesky(G + lam * np.eye(G.shape[0]))
        except np.linalg.LinAlgError:
            lam *= 10
            continue
        return np.linalg.solve(L.T, np.linalg.solve(L, A.T))
    raise ValueError("no ridge inverse")


class FarField:
    """docs/model.md section 5 for one full-attention slot, written from the formulas."""

    def __init__(self, o1, nh, nk, hd):
        self.m_max, self.w, self.sink, self.seal, self.clamp = o1
        self.nh, self.nk, self.hd = nh, nk, hd
        self.group = nh // nk
        # Per position, the smallest |far denominator| / sum_b |g_b Z_b| over its reads:
        # where this is tiny, the rectifier's keep-or-drop turns on rounding.
        self.margin = {}

    def build(self, t, K, V, Q):
        """Seal over rows [0, t) of K, V [*, nk, hd] and queries Q [*, nh, hd]."""
        sink, w = self.sink, self.w
        self.pk, self.pv = K[:sink].copy(), V[:sink].copy()
        L = t - sink
        m = int(min(max(t // 8, 4), self.m_max))
        m = min(m, L)
        self.m = m
        b = [sink + s * L // m for s in range(m + 1)]
        self.kt = np.stack([K[b[s]:b[s + 1]].mean(axis=0) for s in range(m)], axis=1)  # [nk, m, hd]
        self.qt = np.stack([Q[b[s]:b[s + 1]].mean(axis=0) for s in range(m)], axis=1)  # [nh, m, hd]
        self.M, self.shift = [], []
        for h in range(self.nh):
            A = self.qt[h] @ self.kt[h // self.group].T / math.sqrt(self.hd)
            s_h = A.max()
            self.M.append(ridge_pinv(np.exp(A - s_h)))
            self.shift.append(s_h)
        self.T = np.zeros((self.nh, m, self.hd))
        self.Z = np.zeros((self.nh, m))
        self.mx = np.full((self.nh, m), -np.inf)
        self.F = sink
        for j in range(sink, t - w):
            self.insert(K[j], V[j])

    def insert(self, k, v):
        for h in range(self.nh):
            g = h // self.group
            s = self.qt[h] @ k[g] / math.sqrt(self.hd)       # [m]
            up = s > self.mx[h]
            r = np.where(up, np.exp(np.where(up, self.mx[h] - s, 0.0)), 1.0)
            self.T[h] *= r[:, None]
            self.Z[h] *= r
            self.mx[h] = np.maximum(self.mx[h], s)
            e = np.exp(s - self.mx[h])
            self.T[h] += e[:, None] * v[g][None, :]
            self.Z[h] += e
        self.F += 1

    def attend(self, h, q, p, K, V):
        """Head h's output for query q at position p; K, V hold the window rows by position."""
        g = h // self.group
        d = math.sqrt(self.hd)
        near_k = np.concatenate([self.pk[:, g], K[self.F:p + 1, g]])
        near_v = np.concatenate([self.pv[:, g], V[self.F:p + 1, g]])
        sc = near_k @ q / d
        c = sc.max()
        a = self.kt[g] @ q / d
        f = a.max()
        u = np.exp(a - f) @ self.M[h]
        if self.clamp:
            u = np.maximum(u, 0.0)
        live = self.Z[h] > 0
        ex = np.where(live, f + self.mx[h] - self.shift[h], -np.inf)
        if live.any():
            cand = ex[live & (u != 0)]
            if cand.size:
                c = max(c, cand.max())
        e = np.exp(sc - c)
        num = e @ near_v
        den = e.sum()
        if live.any():
            gb = np.where(live, u * np.exp(np.where(live, ex - c, 0.0)), 0.0)
            fden = gb @ self.Z[h]
            scale = np.abs(gb * self.Z[h]).sum()
            if scale > 0:
                self.margin[p] = min(self.margin.get(p, math.inf), abs(fden) / scale)
            if fden > 0:
                num = num + gb @ self.T[h]
                den = den + fden
        return num / den


class Model:
    def __init__(self, model_dir):
        self.cfg = Config(model_dir)
        self.w = Weights(model_dir)
        self._check_tensors()

    def _check_tensors(self):
        c = self.cfg
        want = {"backbone.embeddings.weight": (c.V, c.H), "lm_head.weight": (c.V, c.H),
                "lm_head.logit_scale": (c.V,)}
        for i, ch in enumerate(c.pattern):
            p = "backbone.layers.%d." % i
            if ch == "-":
                want.update({p + "mixer.gate_proj.weight": (c.F, c.H),
                             p + "mixer.up_proj.weight": (c.F, c.H),
                             p + "mixer.down_proj.weight": (c.H, c.F),
                             p + "mixer.suv_gate": (c.F,), p + "mixer.suv_up": (c.F,),
                             p + "mlp_alpha": (c.H,)})
            else:
                q, kv = c.nh * c.hd, c.nk * c.hd
                want.update({p + "mixer.q_proj.weight": (q, c.H),
                             p + "mixer.k_proj.weight": (kv, c.H),
                             p + "mixer.v_proj.weight": (kv, c.H),
                             p + "mixer.g_proj.weight": (q, c.H),
                             p + "mixer.o_proj.weight": (c.H, q),
                             p + "mixer.sqk": (q,), p + "mixer.s_gate": (q,),
                             p + "attn_alpha": (c.H,)})
        for name, shape in want.items():
            if name not in self.w:
                raise ValueError("checkpoint lacks tensor %s" % name)
            if self.w.shape(name) != shape:
                raise ValueError("tensor %s has shape %s, expected %s"
                                 % (name, self.w.shape(name), shape))
        extra = set(self.w.where) - set(want)
        if extra:
            raise ValueError("checkpoint has unexpected tensors: %s" % sorted(extra)[:5])

    # -- sub-layers ---------------------------------------------------------

    def attention(self, i, x, pos, cache):
        """Attention sub-layer output for rows x at positions pos (contiguous, ascending).

        Writes this chunk's k, v into `cache` at its positions, then attends causally to
        whatever the cache holds for earlier positions plus the chunk's own rows.
        """
        c, w, p = self.cfg, self.w, "backbone.layers.%d.mixer." % i
        t = x.shape[0]
        q = (x @ w[p + "q_proj.weight"].T).reshape(t, c.nh, c.hd)
        k = (x @ w[p + "k_proj.weight"].T).reshape(t, c.nk, c.hd)
        v = (x @ w[p + "v_proj.weight"].T).reshape(t, c.nk, c.hd)
        g = x @ w[p + "g_proj.weight"].T                                  # [t, nh*hd]

        prof = c.profile[i]
        q = rope(q, pos, c.theta[prof], c.rotary[prof])
        k = rope(k, pos, c.theta[prof], c.rotary[prof])
        sqk = (w[p + "sqk"] * math.sqrt(c.hd) / c.sigma) ** 2
        q = sqk.reshape(c.nh, c.hd) * n(q)                                # per head
        k = n(k)

        o1 = getattr(cache, "o1", None)
        if o1 is not None and c.pattern[i] == "*":
            return self._attention_o1(i, q, k, v, g, pos, cache)

        cache.k[pos] = k
        cache.v[pos] = v
        end = pos[-1] + 1
        K = cache.k[:end]                                                 # [T, nk, hd]
        Vv = cache.v[:end]
        group = c.nh // c.nk
        kv_of_head = np.arange(c.nh) // group                             # GQA map
        Kh, Vh = K[:, kv_of_head], Vv[:, kv_of_head]                      # [T, nh, hd]

        scores = np.einsum("thd,shd->hts", q, Kh) / math.sqrt(c.hd)      # [nh, t, T]
        key_pos = np.arange(end)
        visible = key_pos[None, :] <= pos[:, None]
        if c.pattern[i] == "S":
            visible &= key_pos[None, :] >= pos[:, None] - c.W + 1
        scores = np.where(visible[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        y = np.einsum("hts,shd->thd", probs, Vh).reshape(t, c.nh * c.hd)

        s_gate = (w[p + "s_gate"] * math.sqrt(c.g0) / c.sigma) ** 2
        y = y * sigmoid(g * s_gate)
        y = n(y)                                                          # whole nh*hd row
        return y @ w[p + "o_proj.weight"].T

    def _gate_out(self, i, y, g):
        c, w, p = self.cfg, self.w, "backbone.layers.%d.mixer." % i
        s_gate = (w[p + "s_gate"] * math.sqrt(c.g0) / c.sigma) ** 2
        y = y * sigmoid(g * s_gate)
        y = n(y)
        return y @ w[p + "o_proj.weight"].T

    def _attention_o1(self, i, q, k, v, g, pos, cache):
        """A full layer with the far field: exact until the seal, then docs/model.md section 5.

        At the start of a chunk the rows before it are final: seal over them once
        pos[0] >= seal, else fold those that left the window into the far field.
        """
        c = self.cfg
        m, w, sink, seal, clamp = cache.o1
        start = pos[0]
        if cache.far is None and start >= seal and start > w + sink + 8:
            cache.far = FarField(cache.o1, c.nh, c.nk, c.hd)
            cache.far.build(start, cache.k[:start], cache.v[:start], cache.q[:start])
        if cache.far is not None:
            while cache.far.F < start - w:
                j = cache.far.F
                cache.far.insert(cache.k[j], cache.v[j])
        cache.k[pos] = k
        cache.v[pos] = v
        cache.q[pos] = q
        t = len(pos)
        if cache.far is None:
            end = pos[-1] + 1
            group = c.nh // c.nk
            kv_of_head = np.arange(c.nh) // group
            Kh, Vh = cache.k[:end][:, kv_of_head], cache.v[:end][:, kv_of_head]
            scores = np.einsum("thd,shd->hts", q, Kh) / math.sqrt(c.hd)
            visible = np.arange(end)[None, :] <= pos[:, None]
            scores = np.where(visible[None], scores, -np.inf)
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            y = np.einsum("hts,shd->thd", probs, Vh).reshape(t, c.nh * c.hd)
        else:
            y = np.zeros((t, c.nh, c.hd))
            for r in range(t):
                for h in range(c.nh):
                    y[r, h] = cache.far.attend(h, q[r, h], pos[r], cache.k, cache.v)
            y = y.reshape(t, c.nh * c.hd)
        return self._gate_out(i, y, g)

    def mlp(self, i, x):
        c, w, p = self.cfg, self.w, "backbone.layers.%d.mixer." % i
        g = (x @ w[p + "gate_proj.weight"].T) * (w[p + "suv_gate"] * math.sqrt(c.H))
        u = (x @ w[p + "up_proj.weight"].T) * (w[p + "suv_up"] * math.sqrt(c.H))
        return n(silu(g) * u) @ w[p + "down_proj.weight"].T

    def layer(self, i, x, pos, cache):
        """One physical layer: a single sub-layer plus the nGPT residual."""
        c, w = self.cfg, self.w
        if c.pattern[i] == "-":
            y = self.mlp(i, x)
            alpha = w["backbone.layers.%d.mlp_alpha" % i]
        else:
            y = self.attention(i, x, pos, cache)
            alpha = w["backbone.layers.%d.attn_alpha" % i]
        rate = np.abs(alpha * c.a0 / c.sigma)
        a, b = n(x), n(y)
        return n(a + rate * (b - a))

    # -- the loop stack and the chunk schedule ------------------------------

    def forward(self, ids, loops=None, kv=None, chunks=None, loops_per_chunk=None, o1=None,
                capture=None):
        """Logits [positions x vocab]. capture=i also keeps, in self.captured, the hidden
        state after physical layer i on the first pass ([positions x hidden]; a CMF skill
        router's phi is its mean over a prompt)."""
        c = self.cfg
        captured = []
        ids = np.asarray(ids, dtype=np.int64)
        total = len(ids)
        if total == 0:
            raise ValueError("no ids")
        if ids.min() < 0 or ids.max() >= c.V:
            raise ValueError("ids must lie in [0, %d)" % c.V)
        loops = c.loops if loops is None else int(loops)
        kv = c.kv_mode if kv is None else kv
        if kv not in ("per_loop", "last_loop"):
            raise ValueError("kv must be per_loop or last_loop, got %r" % kv)
        chunks = [total] if chunks is None else [int(s) for s in chunks]
        if min(chunks) < 1 or sum(chunks) != total:
            raise ValueError("chunk sizes %s must be positive and sum to %d" % (chunks, total))
        if loops_per_chunk is None:
            loops_per_chunk = [loops] * len(chunks)
        else:
            if kv != "last_loop":
                raise ValueError("loops_per_chunk needs kv=last_loop: under per_loop a "
                                 "chunk with fewer loops would leave holes in later loops' caches")
            loops_per_chunk = [int(l) for l in loops_per_chunk]
            if len(loops_per_chunk) != len(chunks):
                raise ValueError("loops_per_chunk has %d entries for %d chunks"
                                 % (len(loops_per_chunk), len(chunks)))
        if min(loops_per_chunk) < 1:
            raise ValueError("loop counts must be >= 1")

        # Cache slots: (physical layer, loop index); the loop index is 0 outside the
        # recurrent block and always 0 under last_loop (one slot per physical layer).
        caches = {}

        def slot(i, loop):
            key = (i, loop if kv == "per_loop" else 0)
            if key not in caches:
                caches[key] = Cache(total, c.nk, c.hd)
                if o1 is not None and c.pattern[i] == "*":
                    caches[key].o1 = tuple(o1)
                    caches[key].q = np.full((total, c.nh, c.hd), np.nan)
                    caches[key].far = None
            return caches[key]

        rec = range(c.n_in, c.n_in + c.n_rec)
        out_rows = []
        start = 0
        for size, nloops in zip(chunks, loops_per_chunk):
            pos = np.arange(start, start + size)
            x = self.w.rows("backbone.embeddings.weight", ids[pos])  # raw, not normalized
            for i in range(c.n_in):
                x = self.layer(i, x, pos, slot(i, 0))
                if i == capture:
                    captured.append(x)
            inp = x
            state = inp
            for loop in range(nloops):
                h = n(state + inp)
                for i in rec:
                    h = self.layer(i, h, pos, slot(i, loop))
                    if i == capture and loop == 0:
                        captured.append(h)
                state = n(h)
            h = state
            for i in range(c.n_in + c.n_rec, c.L):
                h = self.layer(i, h, pos, slot(i, 0))
                if i == capture:
                    captured.append(h)
            # no final norm
            logits = (h @ self.w["lm_head.weight"].T) * (self.w["lm_head.logit_scale"] / c.sigma)
            out_rows.append(logits)
            start += size
        # For callers comparing a float32 engine with the far field: per position, the
        # smallest rectifier margin of any of its far reads (see FarField.margin).
        self.far_margin = {}
        for cache in caches.values():
            far = getattr(cache, "far", None)
            for p, r in (far.margin.items() if far is not None else ()):
                self.far_margin[p] = min(self.far_margin.get(p, math.inf), r)
        self.captured = np.concatenate(captured, axis=0) if captured else None
        return np.concatenate(out_rows, axis=0)


_MODELS = {}


def load(model_dir):
    """Model for a directory, cached while its files are unchanged."""
    model_dir = os.path.abspath(model_dir)
    stamp = tuple(sorted((f, os.stat(os.path.join(model_dir, f)).st_mtime_ns)
                         for f in os.listdir(model_dir)))
    hit = _MODELS.get(model_dir)
    if hit is None or hit[0] != stamp:
        hit = (stamp, Model(model_dir))
        _MODELS[model_dir] = hit
    return hit[1]


def chunk_sizes(total, chunk):
    """Cut `total` rows into chunks of `chunk` (the last one shorter)."""
    return [min(chunk, total - s) for s in range(0, total, chunk)]


def run(model_dir, ids, loops=None, kv=None, chunk=None, chunks=None, loops_per_chunk=None, o1=None):
    """Logits for every position of `ids`, float64 [len(ids), V].

    loops: recurrent passes (default: config n_recurrent_loops).
    kv: "per_loop" or "last_loop" (default: config recurrent_kv_cache_mode).
    chunk: cut into chunks of this many rows; chunks: explicit chunk sizes.
    loops_per_chunk: a loop count per chunk (last_loop only).
    o1: (m, w, sink, seal, clamp) for the far field of the full layers (docs/model.md section 5).
    """
    if chunk is not None and chunks is not None:
        raise ValueError("give chunk or chunks, not both")
    ids = list(ids)
    if chunk is not None:
        if int(chunk) < 1:
            raise ValueError("chunk must be >= 1")
        chunks = chunk_sizes(len(ids), int(chunk))
    return load(model_dir).forward(ids, loops=loops, kv=kv, chunks=chunks,
                                   loops_per_chunk=loops_per_chunk, o1=o1)


def _int_list(s):
    return [int(v) for v in s.split(",") if v.strip() != ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Float64 numpy reference of Dory.")
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--ids", required=True, type=_int_list, help="comma-separated token ids")
    ap.add_argument("--loops", type=int, default=None)
    ap.add_argument("--kv", choices=("per_loop", "last_loop"), default=None)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--chunk", type=int, default=None, help="chunk size (last chunk shorter)")
    g.add_argument("--chunks", type=_int_list, default=None, help="explicit chunk sizes")
    ap.add_argument("--loops-per-chunk", type=_int_list, default=None)
    ap.add_argument("--o1", type=_int_list, default=None, help="far field m,w,sink,seal")
    ap.add_argument("--o1-clamp", action="store_true", help="clamp rectifier instead of aggregate")
    ap.add_argument("-o", "--out", required=True, help="output .npy (float64 [n_ids, V])")
    a = ap.parse_args(argv)
    kv = a.kv
    if a.loops_per_chunk is not None:
        mode = kv or load(a.model).cfg.kv_mode
        if mode != "last_loop":
            ap.error("--loops-per-chunk needs --kv last_loop (per_loop caches would get holes)")
    try:
        o1 = None if a.o1 is None else tuple(a.o1) + (a.o1_clamp,)
        logits = run(a.model, a.ids, loops=a.loops, kv=kv, chunk=a.chunk, chunks=a.chunks,
                     loops_per_chunk=a.loops_per_chunk, o1=o1)
    except ValueError as e:
        ap.exit(2, "dory_ref: error: %s\n" % e)
    np.save(a.out, logits)
    print("wrote %s: %s float64, max |logit| %.3f"
          % (a.out, logits.shape, float(np.abs(logits).max())))


if __name__ == "__main__":
    main()
