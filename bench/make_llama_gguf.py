#!/usr/bin/python3
"""Write a random-weight LLAMA-architecture GGUF with the per-token shape the issue asks for
(Dory-4B at 2 loops): hidden 2560, 16 query / 4 KV heads of 256, ffn 7168, 56 blocks,
vocabulary 131072. numpy only; the file is streamed tensor by tensor (never all in memory).

Weights: 2^24 N(0, 0.02) float32 values are quantized here with ggml's reference rounding
(quantize_row_q8_0_ref / quantize_row_q4_0_ref) into a pool of blocks; every matrix is made
of pool blocks taken from random block offsets (drawing 5e9 normals would take minutes and
changes nothing about speed). 1-D norms are F32 ones. The tokenizer is
a minimal gpt2-style BPE vocabulary (256 byte tokens, filler tokens, one dummy merge, an
end-of-text control token) that llama.cpp loads; the benchmark feeds token ids directly.

usage: make_llama_gguf.py OUT.gguf --type q8_0|q4_0 [--blocks 56] [--seed 0]
"""

import argparse
import os
import struct
import sys
import time

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q4_0, T_Q8_0 = 0, 1, 2, 8
QK = 32
BLOCK_BYTES = {T_Q8_0: 34, T_Q4_0: 18}
FILE_TYPE = {T_Q8_0: 7, T_Q4_0: 2}   # LLAMA_FTYPE_MOSTLY_Q8_0 / _Q4_0


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(t, v):
    if t == STRING:
        return _str(v)
    if t == ARRAY:
        et, items = v
        out = [struct.pack("<IQ", et, len(items))]
        if et == STRING:
            out += [_str(x) for x in items]
        elif et == I32:
            out.append(np.asarray(items, "<i4").tobytes())
        else:
            raise ValueError(et)
        return b"".join(out)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}[t], v)


# ---- ggml reference quantization (ggml-quants.c) -------------------------------------------

def _round_away(x):
    # C roundf: half away from zero (exact: x - trunc(x) is exact in float32)
    t = np.trunc(x)
    return t + np.sign(x) * (np.abs(x - t) >= np.float32(0.5))


def quant_q8_0(x):
    """x: float32 [..., n] with n % 32 == 0 -> raw bytes of block_q8_0 {f16 d; int8 qs[32]}."""
    b = x.reshape(-1, QK)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = _round_away(b * idv[:, None]).astype(np.int8)
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quant_q4_0(x):
    """x: float32 [..., n] -> raw bytes of block_q4_0 {f16 d; uint8 qs[16]} (nibbles, offset 8)."""
    b = x.reshape(-1, QK)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(b.shape[0]), idx]            # the value with the largest |x|, signed
    d = mx / np.float32(-8.0)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    v = b * idv[:, None] + np.float32(8.5)
    q = np.minimum(np.float32(15), np.trunc(v)).astype(np.uint8)   # (int8_t) truncation; v >= 0
    out = np.empty((b.shape[0], 18), np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


QUANT = {T_Q8_0: quant_q8_0, T_Q4_0: quant_q4_0}


def byte_tokens():
    """GPT-2 bytes_to_unicode: the 256 byte-level token strings."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--type", required=True, choices=["q8_0", "q4_0"])
    ap.add_argument("--blocks", type=int, default=56)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ffn", type=int, default=7168)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--bytes-only", action="store_true",
                    help="print PER_TOKEN_BYTES for this shape and type, write nothing")
    a = ap.parse_args()
    qt = {"q8_0": T_Q8_0, "q4_0": T_Q4_0}[a.type]
    H, F, V, hd = a.hidden, a.ffn, a.vocab, a.head_dim
    nq, nk = a.heads * hd, a.kv_heads * hd

    # tokenizer: 256 byte tokens, "ab" (the one merge's result), fillers, <|endoftext|>
    toks = byte_tokens() + ["ab"]
    toks += ["<f%d>" % i for i in range(V - len(toks) - 1)]
    toks.append("<|endoftext|>")
    assert len(toks) == V and len(set(toks)) == V
    ttype = [1] * V
    ttype[V - 1] = 3  # control
    eot = V - 1

    kvs = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "random llama, Dory-4B@2-loops shape, %s" % a.type),
        ("general.file_type", U32, FILE_TYPE[qt]),
        ("general.alignment", U32, 32),
        ("llama.context_length", U32, 4096),
        ("llama.embedding_length", U32, H),
        ("llama.block_count", U32, a.blocks),
        ("llama.feed_forward_length", U32, F),
        ("llama.attention.head_count", U32, a.heads),
        ("llama.attention.head_count_kv", U32, a.kv_heads),
        ("llama.attention.key_length", U32, hd),
        ("llama.attention.value_length", U32, hd),
        ("llama.rope.dimension_count", U32, hd),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.vocab_size", U32, V),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "default"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, toks)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, ttype)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"])),
        ("tokenizer.ggml.bos_token_id", U32, eot),
        ("tokenizer.ggml.eos_token_id", U32, eot),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
    ]

    # tensors: (name, type, row-major shape)
    tens = [("token_embd.weight", qt, (V, H))]
    for i in range(a.blocks):
        p = "blk.%d." % i
        tens += [(p + "attn_norm.weight", T_F32, (H,)),
                 (p + "attn_q.weight", qt, (nq, H)),
                 (p + "attn_k.weight", qt, (nk, H)),
                 (p + "attn_v.weight", qt, (nk, H)),
                 (p + "attn_output.weight", qt, (H, nq)),
                 (p + "ffn_norm.weight", T_F32, (H,)),
                 (p + "ffn_gate.weight", qt, (F, H)),
                 (p + "ffn_up.weight", qt, (F, H)),
                 (p + "ffn_down.weight", qt, (H, F))]
    tens += [("output_norm.weight", T_F32, (H,)), ("output.weight", qt, (V, H))]

    def nbytes(t, shape):
        n = int(np.prod(shape))
        return 4 * n if t == T_F32 else n // QK * BLOCK_BYTES[t]

    align = 32
    hdr = [b"GGUF", struct.pack("<IQQ", 3, len(tens), len(kvs))]
    for k, t, v in kvs:
        hdr.append(_str(k) + struct.pack("<I", t) + _value(t, v))
    off = 0
    offs = []
    for name, t, shape in tens:
        off = (off + align - 1) // align * align
        offs.append(off)
        ne = list(reversed(shape))
        hdr.append(_str(name) + struct.pack("<I", len(ne)) +
                   b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", t, off))
        off += nbytes(t, shape)
    header = b"".join(hdr)
    header += b"\0" * ((-len(header)) % align)

    per_token = sum(nbytes(t, s) for n, t, s in tens if n != "token_embd.weight") + \
        nbytes(qt, (1, H))
    total = len(header) + off
    if a.bytes_only:
        print("PER_TOKEN_BYTES %d" % per_token)
        return 0
    if not a.quiet:
        print("writing %s: %s, %d tensors, %.2f GiB; weight bytes read per token %d (%.3f GiB)"
              % (a.out, a.type, len(tens), total / 2**30, per_token, per_token / 2**30), flush=True)

    tmp = a.out + ".tmp"
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    pools = {}
    with open(tmp, "wb") as f:
        f.write(header)
        base = len(header)
        for j, ((name, t, shape), o) in enumerate(zip(tens, offs)):
            pos = f.tell()
            if pos < base + o:
                f.write(b"\0" * (base + o - pos))
            if t == T_F32:
                f.write(np.ones(shape, "<f4").tobytes())
                continue
            # a pool of 2^24 N(0, 0.02) weights quantized once; each tensor is pool blocks
            # taken from random block offsets (random weights without 5e9 normal draws)
            nb = int(np.prod(shape)) // QK
            bb = BLOCK_BYTES[t]
            if t not in pools:
                x = rng.standard_normal(1 << 24, dtype=np.float32) * np.float32(0.02)
                pools[t] = np.frombuffer(QUANT[t](x), np.uint8).reshape(-1, bb)
            pool = pools[t]
            left = nb
            while left:
                s0 = int(rng.integers(0, pool.shape[0]))
                k = min(left, pool.shape[0] - s0)
                f.write(pool[s0:s0 + k].tobytes())
                left -= k
            if not a.quiet and (name.endswith("ffn_down.weight") or "output" in name
                                or name.startswith("token_embd")):
                print("  [%3d/%d] %-28s %6.1f s" % (j + 1, len(tens), name, time.time() - t0),
                      flush=True)
        assert f.tell() == total, (f.tell(), total)
    os.replace(tmp, a.out)
    if not a.quiet:
        print("wrote %s in %.1f s" % (a.out, time.time() - t0), flush=True)
    print("PER_TOKEN_BYTES %d" % per_token)


if __name__ == "__main__":
    sys.exit(main())
