#!/usr/bin/python3
"""An independent CMF v2 writer (from docs/cmf.md, not from the C++), with numpy encoders for
the dtypes dory.cpp decodes: the suite writes files with it and checks the engine reads them.

    /usr/bin/python3 tests/cmf/cmf_writer.py OUT.cmf     (a small sample file)
"""
import json
import struct
import sys

import numpy as np

F32, F16, BF16, Q8_ROW, Q4_BLOCK, Q8_2F, Q4_TILED, Q4TP = 0, 1, 2, 3, 4, 9, 11, 15
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
