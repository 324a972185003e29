#!/usr/bin/python3
"""An independent CMF v2 writer (from docs/cmf.md, not from the C++), with numpy encoders for
the dtypes dory.cpp decodes: the suite writes files with it and checks the engine reads them.

    /usr/bin/python3 tests/cmf/cmf_writer.py OUT.cmf     (a small sample file)
"""
import json
import struct
import sys

import numpy as np

F32, F16, BF16, Q8_ROW, Q4_BLOCK, Q8_2F, Q4_TILED, Q4TP, Q2TP = 0, 1, 2, 3, 4, 9, 11, 15, 16
M64 = (1 << 64) - 1


def fmix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    x ^= x >> 33
    return x


def hash64(b):
    b = bytes(b)
    acc = 0
    for i in range((len(b) + 7) // 8):
        w = int.from_bytes(b[8 * i:8 * i + 8].ljust(8, b"\0"), "little")
        acc ^= fmix64(w) ^ ((i * 0x9E3779B97F4A7C15) & M64)
    return fmix64(acc ^ len(b))


def enc_q8_2f(w):
    """q8_2f: col = RMS of each column, row_scale = absmax(w / col) / 127, both stored as f16
    first (so decoding with the stored values is exact), q = round(w / col / row_scale)."""
    w = np.asarray(w, np.float32)
    col = np.sqrt((w.astype(np.float64) ** 2).mean(0)).astype(np.float16)
    col[col == 0] = np.float16(1)
    wc = w / col.astype(np.float32)
    rs = (np.abs(wc).max(1) / 127).astype(np.float16)
    rs[rs == 0] = np.float16(1)
    q = np.clip(np.rint(wc / rs.astype(np.float32)[:, None]), -127, 127).astype(np.int8)
    return q.tobytes() + rs.tobytes() + col.tobytes()


def dec_q8_2f(b, rows, cols):
    q = np.frombuffer(b, np.int8, rows * cols).reshape(rows, cols).astype(np.float32)
    rs = np.frombuffer(b, np.float16, rows, rows * cols).astype(np.float32)
    col = np.frombuffer(b, np.float16, cols, rows * cols + 2 * rows).astype(np.float32)
    return q * rs[:, None] * col[None, :]


def enc_q4_block(w):
    f = np.asarray(w, np.float32).ravel()
    ng = (f.size + 31) // 32
    f = np.concatenate([f, np.zeros(ng * 32 - f.size, np.float32)]).reshape(ng, 32)
    sc = (np.abs(f).max(1) / 7).astype(np.float16)
    sc[sc == 0] = np.float16(1)
    nib = (np.clip(np.rint(f / sc.astype(np.float32)[:, None]), -8, 7) + 8).astype(np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.tobytes() + sc.tobytes()


def dec_q4_block(b, n):
    ng = (n + 31) // 32
    packed = np.frombuffer(b, np.uint8, 16 * ng).reshape(ng, 16)
    sc = np.frombuffer(b, np.float16, ng, 16 * ng).astype(np.float32)
    nib = np.empty((ng, 32), np.float32)
    nib[:, 0::2] = packed & 15
    nib[:, 1::2] = packed >> 4
    return ((nib - 8) * sc[:, None]).ravel()[:n]


def enc_q8_row(w):
    """q8_row: int8 q[rows*cols], then f16 scale[rows] = absmax / 127."""
    w = np.asarray(w, np.float32)
    sc = (np.abs(w).max(1) / 127).astype(np.float16)
    sc[sc == 0] = np.float16(1)
    q = np.clip(np.rint(w / sc.astype(np.float32)[:, None]), -127, 127).astype(np.int8)
    return q.tobytes() + sc.tobytes()


def dec_q8_row(b, rows, cols):
    q = np.frombuffer(b, np.int8, rows * cols).reshape(rows, cols).astype(np.float32)
    return q * np.frombuffer(b, np.float16, rows, rows * cols).astype(np.float32)[:, None]


def enc_q4_tiled(w):
    """q4_tiled: q4_block's values and nibble order as 18-byte tiles [f16 scale][16 B]."""
    b = enc_q4_block(w)
    ng = (np.asarray(w).size + 31) // 32
    packed = np.frombuffer(b, np.uint8, 16 * ng).reshape(ng, 16)
    sc = np.frombuffer(b, np.uint8, 2 * ng, 16 * ng).reshape(ng, 2)
    return np.concatenate([sc, packed], 1).tobytes()


def dec_q4_tiled(b, rows, cols):
    t = np.frombuffer(b, np.uint8).reshape(-1, 18)
    return dec_q4_block(t[:, 2:].tobytes() + t[:, :2].tobytes(), rows * cols).reshape(rows, cols)


def _libm_exp2f():
    """C's exp2f, which CMF.md names for the ladder (glibc's is within 0.502 ulp, not always
    correctly rounded: one ulp in 2^step compounds over 31 rungs to ~4e-6, so neither numpy's
    float32 exp2, a SIMD approximation on AVX-512 hosts, nor float64 exp2 rounded once, is
    the same number on every row)."""
    import ctypes
    import ctypes.util
    f = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6").exp2f
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return f


_EXP2F = _libm_exp2f()


def exp2f(x):
    """exp2f element by element (float32 in, float32 out)."""
    x = np.asarray(x, np.float32)
    return np.array([_EXP2F(float(v)) for v in x.ravel()], np.float32).reshape(x.shape)


def ladder(lo, step):
    """A q4tp / q2tp row's rungs: t[0] = 2^lo, t[c] = t[c-1] * 2^step, in float32, in turn."""
    t = np.empty(32, np.float32)
    t[0] = exp2f(lo)
    m = exp2f(step)
    for c in range(1, 32):
        t[c] = np.float32(t[c - 1] * m)
    return t


def ladders(lo, step):
    """ladder() for many rows at once (the same float32 products, in the same order)."""
    t = np.empty((len(lo), 32), np.float32)
    t[:, 0] = exp2f(lo)
    m = exp2f(step)
    for c in range(1, 32):
        t[:, c] = t[:, c - 1] * m
    return t


def enc_tp(w, bits):
    """q4tp (bits 4) / q2tp (bits 2): per row a ladder (f16 lo, f16 step) spanning the groups'
    scales, each group's 5-bit code the rung nearest its scale; nibbles (element 2k the low
    nibble of byte k), or 2-bit codes (4 a byte, LSB first) with w = (c - 1.5) t[code - 1] and
    code 0 an all-zero group. Planes: weights, (lo, step) per row, codes per row."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    gpr = cols // 32
    stride = (5 * gpr + 7) // 8
    g = w.reshape(rows, gpr, 32)
    want = np.abs(g).max(2) / (7.0 if bits == 4 else 1.5)
    pos = np.where(want > 0, want, np.inf)
    lo = np.log2(pos.min(1))
    lo = np.where(np.isfinite(lo), lo, -10).astype(np.float16)
    hi = np.log2(np.where(want > 0, want, 0).max(1).clip(1e-30))
    span = 31 if bits == 4 else 30
    step = np.maximum((hi - lo.astype(np.float32)) / span, 1e-3).astype(np.float16)
    t = ladders(lo, step)
    rungs = t if bits == 4 else t[:, :31]
    lw = np.log2(np.maximum(want, 1e-30))
    c = np.abs(np.log2(rungs)[:, None, :] - lw[:, :, None]).argmin(2)  # [rows, gpr]
    s = np.take_along_axis(rungs, c, 1)[:, :, None]
    if bits == 4:
        code = c
        q = (np.clip(np.rint(g / s), -8, 7) + 8).astype(np.uint8)
        plane = q[:, :, 0::2] | (q[:, :, 1::2] << 4)
    else:
        zero = want == 0
        code = np.where(zero, 0, c + 1)
        q = np.clip(np.rint(g / s + 1.5), 0, 3).astype(np.uint8)
        q[zero] = 0
        plane = q[:, :, 0::4] | (q[:, :, 1::4] << 2) | (q[:, :, 2::4] << 4) | (q[:, :, 3::4] << 6)
    # 5-bit codes, LSB first: bit 5k + j of the row's slice is bit j of code k
    bitsarr = ((code[:, :, None] >> np.arange(5)) & 1).astype(np.uint8).reshape(rows, 5 * gpr)
    bitsarr = np.concatenate([bitsarr, np.zeros((rows, 8 * stride - 5 * gpr), np.uint8)], 1)
    codes = np.packbits(bitsarr, axis=1, bitorder="little")
    params = np.stack([lo, step], 1).astype(np.float16)
    return plane.astype(np.uint8).tobytes() + params.tobytes() + codes.tobytes()


def dec_tp(b, rows, cols, bits):
    gpr = cols // 32
    stride = (5 * gpr + 7) // 8
    gb = 16 if bits == 4 else 8
    params = np.frombuffer(b, np.float16, 2 * rows, rows * gpr * gb).reshape(rows, 2)
    out = np.empty((rows, cols), np.float32)
    for r in range(rows):
        t = ladder(params[r, 0], params[r, 1])
        cbase = rows * gpr * gb + 4 * rows + r * stride
        cw = int.from_bytes(b[cbase:cbase + stride], "little")
        for k in range(gpr):
            code = (cw >> (5 * k)) & 31
            raw = np.frombuffer(b, np.uint8, gb, (r * gpr + k) * gb)
            if bits == 4:
                q = np.empty(32, np.float32)
                q[0::2], q[1::2] = raw & 15, raw >> 4
                out[r, 32 * k:32 * k + 32] = (q - 8) * t[code]
            else:
                q = np.stack([(raw >> s) & 3 for s in (0, 2, 4, 6)], 1).ravel().astype(np.float32)
                out[r, 32 * k:32 * k + 32] = 0 if code == 0 else (q - 1.5) * t[code - 1]
    return out


def write(path, tensors, arch=None, vocab=b"", quant_type="Q8_2F", extra_header=None, features=1):
    """tensors: [(name, dtype, shape, payload bytes)]. Lays the file out as cortiq's writers
    do: envelope, header at 128, directory, data at a 4096 boundary (tensors on 64), vocab."""
    header = {"format": "cmf", "version": 2, "quant_type": quant_type, "arch": arch or {"arch_name": "dory"}}
    header.update(extra_header or {})
    hb = json.dumps(header).encode()
    recs, pool, data = b"", b"", b""
    for name, dt, shape, payload in tensors:
        data += b"\0" * (-len(data) % 64)
        nb = name.encode()
        dims = list(shape) + [0] * (6 - len(shape))
        recs += struct.pack("<IHBB6IQQQ", len(pool), len(nb), dt, len(shape), *dims, len(data), len(payload),
                            hash64(payload))
        pool += nb
        data += payload
    d = struct.pack("<QQ", len(tensors), 16 + len(recs)) + recs + pool
    hoff, doff = 128, 128 + len(hb)
    data_off = (doff + len(d) + 4095) // 4096 * 4096
    voff = data_off + len(data) if vocab else 0
    env = b"CMF\x01" + struct.pack("<III", 2, 0, features)
    env += struct.pack("<QQQQQQ", hoff, len(hb), doff, len(d), data_off, len(data))
    env += struct.pack("<QQQQQQ", 0, 0, voff, len(vocab), 0, 0)
    env += struct.pack("<QQ", hash64(hb), hash64(d))
    assert len(env) == 128
    body = env + hb + d
    body += b"\0" * (data_off - len(body)) + data + vocab
    with open(path, "wb") as f:
        f.write(body)


def sample(path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    write(path, [("w.q8_2f", Q8_2F, (8, 64), enc_q8_2f(w)),
                 ("w.q4_block", Q4_BLOCK, (8, 64), enc_q4_block(w)),
                 ("v.f16", F16, (64,), w[0].astype(np.float16).tobytes())],
          vocab=b'{"model":{"type":"BPE","vocab":{}}}',
          extra_header={"skills": [{"id": "sql", "layers": [1]}]})


if __name__ == "__main__":
    sample(sys.argv[1])
