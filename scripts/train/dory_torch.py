"""Dory (docs/model.md section 1) in PyTorch, written for training.

The module tree mirrors the Hugging Face tensor names, so `state_dict()` is a Dory
checkpoint as published: `backbone.embeddings.weight`, `backbone.layers.{i}.mixer.*`,
`backbone.layers.{i}.attn_alpha | mlp_alpha`, `lm_head.weight`, `lm_head.logit_scale`.
The scale vectors are trained in the published parameterization: the forward pass uses
them only through the formulas of docs/model.md (|alpha*a0/sigma|, (sqk*sqrt(hd)/sigma)^2, ...).

Two ways through the same layers:
  - forward(ids, loops): a whole batch of sequences at once, as in training (per_loop
    semantics: every loop attends to its own keys); causal flash attention for the full
    layers, a blocked sliding window for the S layers;
  - Cached: the inference schedule, chunk by chunk, with explicit KV caches in either
    recurrent_kv_cache_mode (per_loop: one cache per loop index; last_loop: one per
    physical layer, each loop overwriting the chunk's rows). This is the reference the
    engine's logits are checked against.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6


def up(x):
    """At least fp32 (fp64 stays fp64: the reference runs in float64)."""
    return x if x.dtype == torch.float64 else x.float()


def nrm(x):
    """n(x) = x / sqrt(sum x^2 + eps) over the last dim, in fp32 (docs/model.md: all norms in fp32)."""
    xf = up(x)
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + EPS)


def rope(x, pos, theta, r):
    """NeoX RoPE on the first r dims of each head. x: [..., T, heads, hd], pos: [T]."""
    half = r // 2
    inv = theta ** (-2.0 * torch.arange(half, device=x.device, dtype=torch.float64) / r)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cos(ang).to(x.dtype)[:, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, None, :]
    a, b = x[..., :half], x[..., half:r]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., r:]], dim=-1)


def sdpa(q, k, v, attn_mask=None, is_causal=False):
    """F.scaled_dot_product_attention where torch has it (2.0 and later, the GPU machine's);
    else the same softmax(q k^T / sqrt(d) + mask) v written out (Debian 12's torch 1.13, which
    runs train.py's CPU smoke runs)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    if is_causal:
        T, S = s.shape[-2], s.shape[-1]
        attn_mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(s, -1).to(v.dtype) @ v


class Config:
    def __init__(self, c):
        self.raw = c
        self.H, self.F = c["hidden_size"], c["intermediate_size"]
        self.nh, self.nk = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd, self.V = c["attention_head_dim"], c["vocab_size"]
        self.pattern = c["hybrid_layer_pattern"]
        self.L = len(self.pattern)
        self.n_in, self.n_rec, self.n_out = (c["n_input_layers"], c["n_recurrent_layers"],
                                             c["n_output_layers"])
        assert self.n_in + self.n_rec + self.n_out == self.L
        self.loops = c["n_recurrent_loops"]
        self.W = c["swa_window_size"]
        self.theta = {1: c["rope_theta"], 2: c["rope_theta_2"]}
        self.rotary = {1: int(self.hd * c["partial_rotary_factor"]),
                       2: int(self.hd * c["partial_rotary_factor_2"])}
        self.profile = c["rope_profile_layers"]
        self.sigma, self.a0 = c["init_method_std"], c["ngpt_alpha_init"]
        g0 = c["attention_output_gate_logit_scale_init"]
        self.g0 = math.sqrt(self.H) if g0 is None else g0


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, q, kv = cfg.H, cfg.nh * cfg.hd, cfg.nk * cfg.hd
        self.q_proj = nn.Linear(H, q, bias=False)
        self.k_proj = nn.Linear(H, kv, bias=False)
        self.v_proj = nn.Linear(H, kv, bias=False)
        self.g_proj = nn.Linear(H, q, bias=False)
        self.o_proj = nn.Linear(q, H, bias=False)
        self.sqk = nn.Parameter(torch.empty(q))
        self.s_gate = nn.Parameter(torch.empty(q))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.H, cfg.F, bias=False)
        self.up_proj = nn.Linear(cfg.H, cfg.F, bias=False)
        self.down_proj = nn.Linear(cfg.F, cfg.H, bias=False)
        self.suv_gate = nn.Parameter(torch.empty(cfg.F))
        self.suv_up = nn.Parameter(torch.empty(cfg.F))


class Layer(nn.Module):
    def __init__(self, cfg, kind):
        super().__init__()
        self.kind = kind
        if kind == "-":
            self.mixer = MLP(cfg)
            self.mlp_alpha = nn.Parameter(torch.empty(cfg.H))
        else:
            self.mixer = Attention(cfg)
            self.attn_alpha = nn.Parameter(torch.empty(cfg.H))

    @property
    def alpha(self):
        return self.mlp_alpha if self.kind == "-" else self.attn_alpha


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = nn.Embedding(cfg.V, cfg.H)
        self.layers = nn.ModuleList([Layer(cfg, k) for k in cfg.pattern])


class LMHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.V, cfg.H))
        self.logit_scale = nn.Parameter(torch.empty(cfg.V))


class Dory(nn.Module):
    def __init__(self, config_dict):
        super().__init__()
        self.cfg = cfg = Config(config_dict)
        self.backbone = Backbone(cfg)
        self.lm_head = LMHead(cfg)
        self._masks = {}
        # Training only (not part of Dory): dropout on the attention output and the MLP
        # hidden, both before a norm; the corpus is small and a 7M model overfits it.
        self.p_drop = 0.0
        # Training only: a compiled copy of _run_seq (torch.compile), used by forward() in
        # training mode; evaluation and the reference stay eager.
        self.seq_compiled = None

    # -- initialisation: effective values of an nGPT at its start -----------------------
    @torch.no_grad()
    def init_weights(self, generator=None):
        c = self.cfg
        s = c.sigma
        for name, p in self.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, s, generator=generator)     # W x ~ sigma for a unit x
            elif name.endswith("_alpha"):
                p.fill_(s)                                  # |alpha a0 / sigma| = a0
            elif name.endswith("sqk"):
                p.fill_(s)                                  # (sqk sqrt(hd)/sigma)^2 = hd
            elif name.endswith("s_gate"):
                p.fill_(math.sqrt(s / c.g0))                # gate logits g/sigma ~ 1
            elif name.endswith(("suv_gate", "suv_up")):
                p.fill_(1.0 / (s * math.sqrt(c.H)))         # SiLU inputs ~ 1
            elif name.endswith("logit_scale"):
                p.fill_(1.0)
            else:
                raise ValueError(name)

    # -- the pieces of the forward pass of docs/model.md ----------------------------------------------
    def _residual(self, layer, x, y):
        c = self.cfg
        a = (up(layer.alpha) * (c.a0 / c.sigma)).abs()
        nx = nrm(x)
        return nrm(nx + a * (nrm(y) - nx))

    def _qkvg(self, i, layer, x, pos):
        c = self.cfg
        m = layer.mixer
        lead = x.shape[:-1]
        # RoPE and the norms in fp32 (or fp64): bf16 would round the rotation.
        q = up(m.q_proj(x)).view(*lead, c.nh, c.hd)
        k = up(m.k_proj(x)).view(*lead, c.nk, c.hd)
        v = m.v_proj(x).view(*lead, c.nk, c.hd)
        g = m.g_proj(x)
        prof = c.profile[i]
        q = rope(q, pos, c.theta[prof], c.rotary[prof])
        k = rope(k, pos, c.theta[prof], c.rotary[prof])
        sq = (up(m.sqk) * (math.sqrt(c.hd) / c.sigma)).pow(2).view(c.nh, c.hd)
        q = (sq * nrm(q)).to(x.dtype)
        k = nrm(k).to(x.dtype)
        return q, k, v, g

    def _attn_out(self, layer, y, g):
        c = self.cfg
        m = layer.mixer
        sg = (up(m.s_gate) * (math.sqrt(c.g0) / c.sigma)).pow(2)
        y = up(y) * torch.sigmoid(up(g) * sg)
        if self.training and self.p_drop > 0:
            y = F.dropout(y, self.p_drop)
        return m.o_proj(nrm(y).to(g.dtype))

    def _mlp(self, layer, x):
        c = self.cfg
        m = layer.mixer
        sH = math.sqrt(c.H)
        gt = up(m.gate_proj(x)) * (up(m.suv_gate) * sH)
        u = up(m.up_proj(x)) * (up(m.suv_up) * sH)
        hid = F.silu(gt) * u
        if self.training and self.p_drop > 0:
            hid = F.dropout(hid, self.p_drop)
        return m.down_proj(nrm(hid).to(x.dtype))

    def _block_ranges(self):
        c = self.cfg
        return (range(0, c.n_in), range(c.n_in, c.n_in + c.n_rec),
                range(c.n_in + c.n_rec, c.L))

    # -- training: whole sequences ------------------------------------------------------
    def _sliding_mask(self, nb, W, device):
        key = (nb, W, device)
        if key not in self._masks:
            i = torch.arange(W, device=device)[:, None]
            j = torch.arange(2 * W, device=device)[None, :]
            m = (j > i) & (j <= i + W)                        # keys (p-W, p] of query p
            m = m[None].repeat(nb, 1, 1)
            m[0, :, :W] = False                               # block 0 has no previous block
            self._masks[key] = m[:, None]                     # [nb, 1, W, 2W]
        return self._masks[key]

    def _attention_seq(self, i, layer, x, pos):
        c = self.cfg
        B, T, _ = x.shape
        q, k, v, g = self._qkvg(i, layer, x, pos)
        rep = c.nh // c.nk
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        if layer.kind == "*" or T <= c.W:
            if layer.kind == "*":
                y = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            else:
                p = torch.arange(T, device=x.device)
                m = (p[None, :] <= p[:, None]) & (p[None, :] > p[:, None] - c.W)
                y = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=m)
            y = y.transpose(1, 2).reshape(B, T, c.nh * c.hd)
        else:
            # Sliding window in blocks of W: the queries of block b see keys of blocks
            # b-1 and b, masked to (p-W, p]. T must be a multiple of W.
            W = c.W
            assert T % W == 0, "sequence length must be a multiple of swa_window_size"
            nb = T // W
            qb = q.view(B, nb, W, c.nh, c.hd)
            kb = k.view(B, nb, W, c.nh, c.hd)
            vb = v.view(B, nb, W, c.nh, c.hd)
            kprev = torch.cat([torch.zeros_like(kb[:, :1]), kb[:, :-1]], dim=1)
            vprev = torch.cat([torch.zeros_like(vb[:, :1]), vb[:, :-1]], dim=1)
            k2 = torch.cat([kprev, kb], dim=2)                # [B, nb, 2W, nh, hd]
            v2 = torch.cat([vprev, vb], dim=2)
            mask = self._sliding_mask(nb, W, x.device)
            y = sdpa(
                qb.permute(0, 1, 3, 2, 4).reshape(B * nb, c.nh, W, c.hd),
                k2.permute(0, 1, 3, 2, 4).reshape(B * nb, c.nh, 2 * W, c.hd),
                v2.permute(0, 1, 3, 2, 4).reshape(B * nb, c.nh, 2 * W, c.hd),
                attn_mask=mask.repeat(B, 1, 1, 1))
            y = y.view(B, nb, c.nh, W, c.hd).permute(0, 1, 3, 2, 4).reshape(B, T, c.nh * c.hd)
        return self._attn_out(layer, y, g)

    def _run_seq(self, idx, x, pos, dtype):
        for i in idx:
            layer = self.backbone.layers[i]
            xin = x.to(dtype)
            y = self._mlp(layer, xin) if layer.kind == "-" else self._attention_seq(i, layer, xin, pos)
            x = self._residual(layer, x, y)
        return x

    def forward(self, ids, loops=None, dtype=torch.bfloat16, bptt=0, aux=()):
        """ids [B, T] -> logits [B, T, V] (float32 math for norms, dtype for matmuls).
        bptt > 0: gradients flow through the last `bptt` passes only, the earlier ones run
        without them (truncated backpropagation through the loops, as the recurrent-depth
        models are trained: deep counts cost little more than `bptt` passes).
        aux: pass counts (< loops) after which the output block also reads the state out;
        then returns (logits, [logits after each of them]) (early-exit training: the read-out
        after one pass is what the exit gates use). When self.hold_from is set, self.moves
        becomes each pass's move from hold_from passes on: the mean over positions of
        1 - cos(state after it, state before it) (the states are unit vectors)."""
        c = self.cfg
        loops = c.loops if loops is None else loops
        pos = torch.arange(ids.shape[1], device=ids.device)
        inp_r, rec_r, out_r = self._block_ranges()
        x = self.backbone.embeddings(ids).float()
        run = self.seq_compiled if (self.training and self.seq_compiled is not None) else self._run_seq
        inp = run(inp_r, x, pos, dtype)
        state = inp
        early = []
        hold_from = getattr(self, "hold_from", 0)
        self.moves = []
        for k in range(loops):
            with torch.set_grad_enabled(torch.is_grad_enabled() and not (0 < bptt <= loops - 1 - k)):
                h = nrm(state + inp)
                h = run(rec_r, h, pos, dtype)
                prev, state = state, nrm(h)
                if hold_from and k >= hold_from:
                    self.moves.append((1.0 - (state * prev).sum(-1)).mean())
            if k + 1 in aux and k + 1 < loops:
                early.append(self.logits(run(out_r, state, pos, dtype).to(dtype)))
        h = run(out_r, state, pos, dtype)
        out = self.logits(h.to(dtype))
        return (out, early) if aux else out

    def forward_any(self, ids, loops=None):
        """forward() for any length: pads [B, T] on the right to whole windows (causal,
        so the padding changes nothing before it) and drops the padded rows."""
        T, W = ids.shape[1], self.cfg.W
        pad = (-T) % W if T > W else 0
        if pad:
            ids = torch.cat([ids, ids.new_zeros(ids.shape[0], pad)], dim=1)
        return self.forward(ids, loops)[:, :T]

    def logits(self, h):
        c = self.cfg
        return F.linear(h, self.lm_head.weight.to(h.dtype)).float() * (
            self.lm_head.logit_scale.float() / c.sigma)


class Cached:
    """The inference schedule with explicit KV caches (one sequence, float64 by default).

    feed(ids, loops) runs one chunk at the current position and returns its logits.
    """

    def __init__(self, model, mode, max_len, dtype=torch.float64, device="cpu"):
        assert mode in ("per_loop", "last_loop")
        self.m, self.mode, self.dtype, self.device = model, mode, dtype, device
        self.max_len, self.pos = max_len, 0
        self.caches = {}

    def _cache(self, i, slot):
        key = (i, slot)
        if key not in self.caches:
            c = self.m.cfg
            z = torch.full((self.max_len, c.nk, c.hd), float("nan"), dtype=self.dtype,
                           device=self.device)
            self.caches[key] = [z, z.clone()]
        return self.caches[key]

    def _attention(self, i, layer, x, pos, slot):
        m, c = self.m, self.m.cfg
        q, k, v, g = m._qkvg(i, layer, x, pos)
        kc, vc = self._cache(i, slot)
        p0, p1 = int(pos[0]), int(pos[-1]) + 1
        kc[p0:p1] = k
        vc[p0:p1] = v
        K = kc[:p1].repeat_interleave(c.nh // c.nk, dim=1)    # [p1, nh, hd]
        V = vc[:p1].repeat_interleave(c.nh // c.nk, dim=1)
        s = torch.einsum("thd,phd->htp", q, K) / math.sqrt(c.hd)
        kp = torch.arange(p1, device=x.device)[None, :]
        qp = pos[:, None]
        ok = kp <= qp
        if layer.kind == "S":
            ok &= kp > qp - c.W
        s = s.masked_fill(~ok[None], float("-inf"))
        y = torch.einsum("htp,phd->thd", torch.softmax(s, dim=-1), V).reshape(len(pos), -1)
        return m._attn_out(layer, y, g)

    def _run(self, idx, x, pos, slot):
        m = self.m
        for i in idx:
            layer = m.backbone.layers[i]
            y = m._mlp(layer, x) if layer.kind == "-" else self._attention(i, layer, x, pos, slot)
            x = m._residual(layer, x, y).to(self.dtype)
        return x

    @torch.no_grad()
    def feed(self, ids, loops):
        m = self.m
        ids = torch.as_tensor(ids, device=self.device)
        pos = torch.arange(self.pos, self.pos + len(ids), device=self.device)
        inp_r, rec_r, out_r = m._block_ranges()
        x = m.backbone.embeddings.weight.to(self.dtype)[ids]
        inp = self._run(inp_r, x, pos, 0)
        state = inp
        for loop in range(loops):
            h = nrm(state + inp).to(self.dtype)
            h = self._run(rec_r, h, pos, loop if self.mode == "per_loop" else 0)
            state = nrm(h).to(self.dtype)
        h = self._run(out_r, state, pos, 0)
        self.pos += len(ids)
        return F.linear(h, m.lm_head.weight.to(self.dtype)) * (
            m.lm_head.logit_scale.to(self.dtype) / m.cfg.sigma)
