#!/usr/bin/env python3
"""Checks the CUDA K-type decode kernel's lane mapping (kernels.cu, k_lin_kq) on the host:
random Q4_K / Q5_K / Q6_K super-blocks, dequantized the way ggml's reference does it, dotted
with a random int8 input, against the sum the kernel's lanes form (each lane's 16-byte words,
dp4a sums, scales as the kernel decodes them). Needs numpy: /usr/bin/python3."""
import numpy as np

rng = np.random.default_rng(0)


def f16(b, o):
    return float(np.frombuffer(bytes(b[o:o + 2]), dtype=np.float16)[0])


def scale_min_k4(j, s):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def deq(kind, b):
    y = np.zeros(256)
    if kind == "q6_k":
        ql, qh, sc = b[0:128], b[128:192], b[192:208].view(np.int8)
        d = f16(b, 208)
        for n in range(2):
            for l in range(32):
                is_ = l // 16
                q1 = int((ql[64 * n + l] & 0xF) | (((qh[32 * n + l] >> 0) & 3) << 4)) - 32
                q2 = int((ql[64 * n + l + 32] & 0xF) | (((qh[32 * n + l] >> 2) & 3) << 4)) - 32
                q3 = int((ql[64 * n + l] >> 4) | (((qh[32 * n + l] >> 4) & 3) << 4)) - 32
                q4 = int((ql[64 * n + l + 32] >> 4) | (((qh[32 * n + l] >> 6) & 3) << 4)) - 32
                y[128 * n + l] = d * sc[8 * n + is_] * q1
                y[128 * n + l + 32] = d * sc[8 * n + is_ + 2] * q2
                y[128 * n + l + 64] = d * sc[8 * n + is_ + 4] * q3
                y[128 * n + l + 96] = d * sc[8 * n + is_ + 6] * q4
        return y
    d, dmin, s = f16(b, 0), f16(b, 2), b[4:16]
    qs = b[16:144] if kind == "q4_k" else b[48:176]
    qh = b[16:48]
    for jj in range(4):
        for h in range(2):
            j = 2 * jj + h
            sc, m = scale_min_k4(j, s)
            for l in range(32):
                q = (qs[32 * jj + l] >> (4 * h)) & 0xF
                if kind == "q5_k":
                    q += 16 if qh[l] & (1 << j) else 0
                y[32 * j + l] = d * sc * q - dmin * m
    return y


def words(b, o):
    return [int.from_bytes(bytes(b[o + 4 * e:o + 4 * e + 4]), "little") for e in range(4)]


def dp4a(w, x4):  # w: uint32 of 4 signed bytes, x4: 4 int8
    return sum(int(np.int8(np.uint8((w >> (8 * i)) & 0xFF))) * int(x4[i]) for i in range(4))


def dot16(ws, x):  # x: 16 int8
    return sum(dp4a(ws[e], x[4 * e:4 * e + 4]) for e in range(4))


def vsub4(v, c):
    out = 0
    for i in range(4):
        out |= (((v >> (8 * i)) - (c >> (8 * i))) & 0xFF) << (8 * i)
    return out


def kernel(kind, b, x):
    total = 0.0
    if kind == "q6_k":  # 4 lanes a super-block: half = c // 2, hh = c % 2
        sc = b[192:208]
        d = f16(b, 208)
        slo_w = [int.from_bytes(bytes(sc[0:4]), "little"), int.from_bytes(bytes(sc[8:12]), "little")]
        shi_w = [int.from_bytes(bytes(sc[4:8]), "little"), int.from_bytes(bytes(sc[12:16]), "little")]
        for c in range(4):
            half, hh = c // 2, c % 2
            A, B, H = words(b, 64 * half + 16 * hh), words(b, 64 * half + 32 + 16 * hh), words(b, 128 + 32 * half + 16 * hh)
            s = 0.0
            for q in range(4):
                w = []
                for e in range(4):
                    lo = B[e] if q & 1 else A[e]
                    v = ((lo >> (4 if q >= 2 else 0)) & 0x0F0F0F0F) | (((H[e] >> (2 * q)) & 0x03030303) << 4)
                    w.append(vsub4(v, 0x20202020))
                k = hh + 2 * q
                word = slo_w[half] if k < 4 else shi_w[half]
                scq = int(np.int8(np.uint8((word >> (8 * (k & 3))) & 0xFF)))
                xs = x[128 * half + 32 * q + 16 * hh:][:16]
                s += scq * dot16(w, xs)
            total += d * s
        return total
    h = words(b, 0)
    for c in range(8):
        half, hh = c // 2, c % 2
        Q = words(b, (16 if kind == "q4_k" else 48) + 32 * half + 16 * hh)
        lo = [q & 0x0F0F0F0F for q in Q]
        hi = [(q >> 4) & 0x0F0F0F0F for q in Q]
        if kind == "q5_k":
            Hq = words(b, 16 + 16 * hh)
            lo = [lo[e] | (((Hq[e] >> (2 * half)) & 0x01010101) << 4) for e in range(4)]
            hi = [hi[e] | (((Hq[e] >> (2 * half + 1)) & 0x01010101) << 4) for e in range(4)]

        def smin(j):
            if j < 4:
                return (h[1] >> (8 * j)) & 63, (h[2] >> (8 * j)) & 63
            s_ = 8 * (j - 4)
            return (((h[3] >> s_) & 0xF) | (((h[1] >> (s_ + 6)) & 3) << 4),
                    ((h[3] >> (s_ + 4)) & 0xF) | (((h[2] >> (s_ + 6)) & 3) << 4))
        sc0, m0 = smin(2 * half)
        sc1, m1 = smin(2 * half + 1)
        d = float(np.frombuffer((h[0] & 0xFFFF).to_bytes(2, "little"), np.float16)[0])
        dm = float(np.frombuffer((h[0] >> 16).to_bytes(2, "little"), np.float16)[0])
        xa = x[64 * half + 16 * hh:][:16]
        xb = x[64 * half + 32 + 16 * hh:][:16]
        ia, ib = dot16(lo, xa), dot16(hi, xb)
        sa, sb = int(np.sum(xa)), int(np.sum(xb))
        total += d * (sc0 * ia + sc1 * ib) - dm * (m0 * sa + m1 * sb)
    return total


for kind, size in (("q4_k", 144), ("q5_k", 176), ("q6_k", 210)):
    worst = 0.0
    for trial in range(20):
        b = rng.integers(0, 256, size, dtype=np.uint8)
        hd = np.array([rng.uniform(0.001, 0.02), rng.uniform(0.001, 0.02)], np.float16).view(np.uint8)
        if kind == "q6_k":
            b[208:210] = hd[:2]
        else:
            b[0:4] = hd
        x = rng.integers(-127, 128, 256)
        ref = float(deq(kind, b) @ x)
        got = kernel(kind, b, x)
        worst = max(worst, abs(ref - got) / max(1.0, abs(ref)))
    print("%s: kernel lanes vs reference dequant, worst relative error %.2e" % (kind, worst))
    assert worst < 1e-9, kind
