#!/usr/bin/env python3
"""Checks the CUDA prompt-attention kernel's logic (kernels.cu, k_flash_attn) on the host:
an emulation of its blocks, warps and lanes (mma.sync m16n8k16 fragments as the PTX ISA lays
them out: A rows g / g+8, columns 2t, 2t+1 and +8; B k rows 2t, 2t+1 and +8, column g; C rows
g / g+8, columns 2t, 2t+1), its 64-position key tiles, masks, ring slots and online softmax
in log2 units, against plain softmax attention in float64 over the same bf16-rounded inputs.
Needs numpy: /usr/bin/python3."""
import numpy as np

rng = np.random.default_rng(1)
FA_M, FA_N = 64, 64


def bf16(a):
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def mma(c, A, B):  # A 16x16, B 16x8 (k x n), c 16x8: the warp's whole tile
    return c + A.astype(np.float64) @ B.astype(np.float64)


def flash(q, K, V, rows, nh, nk, hd):
    T = len(rows)
    out = np.full((T, nh, hd), np.nan)
    for bx in range((T + FA_M - 1) // FA_M):
        t0 = bx * FA_M
        for h in range(nh):
            kvh = h // (nh // nk)
            Qs = np.zeros((FA_M, hd), np.float32)
            for rr in range(FA_M):
                if t0 + rr < T:
                    Qs[rr] = bf16(q[t0 + rr, h])
            ring, kstart, kend = rows[t0]["ring"], rows[t0]["lo"], rows[min(T, t0 + FA_M) - 1]["pos"]
            for warp in range(4):
                wf, wl = t0 + warp * 16, min(T - 1, t0 + warp * 16 + 15)
                wlo = rows[wf]["lo"] if wf < T else 0
                whi = rows[wl]["pos"] if wf < T else -1
                pos = np.array([rows[t0 + warp * 16 + i]["pos"] if t0 + warp * 16 + i < T else -1 for i in range(16)])
                lo = np.array([rows[t0 + warp * 16 + i]["lo"] if t0 + warp * 16 + i < T else 0 for i in range(16)])
                o = np.zeros((16, hd))
                m = np.full(16, -np.inf)
                l = np.zeros(16)
                sl2 = 1.4426950408889634 / np.sqrt(hd)
                kb = kstart
                while kb <= kend:
                    Ks = np.zeros((FA_N, hd), np.float32)
                    Vs = np.zeros((FA_N, hd), np.float32)
                    for key in range(FA_N):
                        p = kb + key
                        if p <= kend:
                            slot = p % ring if ring else p
                            Ks[key] = bf16(K[slot, kvh])
                            Vs[key] = bf16(V[slot, kvh])
                    if not (kb > whi or kb + FA_N - 1 < wlo):
                        S = np.zeros((16, FA_N))
                        for ks in range(hd // 16):
                            A = Qs[warp * 16:warp * 16 + 16, ks * 16:ks * 16 + 16]
                            for j in range(8):
                                S[:, j * 8:j * 8 + 8] = mma(S[:, j * 8:j * 8 + 8], A, Ks[j * 8:j * 8 + 8, ks * 16:ks * 16 + 16].T)
                        p_ = kb + np.arange(FA_N)
                        ok = (p_[None, :] >= lo[:, None]) & (p_[None, :] <= pos[:, None])
                        S = np.where(ok, S * sl2, -np.inf)
                        x = S.max(1)
                        n_ = np.maximum(m, x)
                        u = np.where(n_ == -np.inf, 0.0, n_)
                        c = np.exp2(m - u)
                        m = n_
                        l *= c
                        o *= c[:, None]
                        P = np.exp2(S - u[:, None])
                        l += P.sum(1)
                        Pb = bf16(P)
                        for kk in range(4):
                            for n in range(hd // 8):
                                o[:, n * 8:n * 8 + 8] = mma(o[:, n * 8:n * 8 + 8], Pb[:, kk * 16:kk * 16 + 16], Vs[kk * 16:kk * 16 + 16, n * 8:n * 8 + 8])
                    kb += FA_N
                for i in range(16):
                    t = t0 + warp * 16 + i
                    if t < T:
                        out[t, h] = o[i] / l[i] if l[i] > 0 else 0.0
    return out


def reference(q, K, V, rows, nh, nk, hd):
    T = len(rows)
    out = np.zeros((T, nh, hd))
    for t, r in enumerate(rows):
        for h in range(nh):
            kvh = h // (nh // nk)
            ps = np.arange(r["lo"], r["pos"] + 1)
            slots = ps % r["ring"] if r["ring"] else ps
            k = bf16(K[slots, kvh]).astype(np.float64)
            v = bf16(V[slots, kvh]).astype(np.float64)
            s = k @ bf16(q[t, h]).astype(np.float64) / np.sqrt(hd)
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ v
    return out


for (T, start, window, ring, nh, nk, hd) in ((70, 0, 0, 0, 4, 2, 16), (100, 37, 0, 0, 2, 1, 32),
                                               (90, 200, 20, 20 + 8 + 90, 4, 4, 16), (64, 5, 4, 4 + 3 + 64, 2, 2, 64)):
    rows = []
    for t in range(T):
        pos = start + t
        rows.append({"pos": pos, "lo": max(0, pos - window + 1) if window else 0, "ring": ring})
    n_slots = ring if ring else start + T
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    K = rng.standard_normal((n_slots, nk, hd)).astype(np.float32)
    V = rng.standard_normal((n_slots, nk, hd)).astype(np.float32)
    if ring:  # the ring holds each position's row at p % ring
        Kf = rng.standard_normal((start + T, nk, hd)).astype(np.float32)
        Vf = rng.standard_normal((start + T, nk, hd)).astype(np.float32)
        for p in range(start + T):
            K[p % ring], V[p % ring] = Kf[p], Vf[p]
    got = flash(q, K, V, rows, nh, nk, hd)
    ref = reference(q, K, V, rows, nh, nk, hd)
    err = np.abs(got - ref).max()
    print("T %d start %d window %d ring %d heads %d/%d hd %d: max |flash - reference| %.2e" % (T, start, window, ring, nh, nk, hd, err))
    assert np.isfinite(got).all() and err < 2e-2, err
