"""A minimal, independent GGUF v3 writer/reader (numpy only), written from the
published spec (ggml docs/gguf.md) and llama.cpp's Dory key names: NOT the C++
writer under test. Also a tiny safetensors reader for the HF checkpoints."""

import json
import struct

import numpy as np

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types
T_F32, T_F16, T_Q4_0, T_Q8_0, T_BF16 = 0, 1, 2, 8, 30


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(t, v):
    if t == STRING:
        return _str(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(_value(et, x) for x in items)
    return struct.pack(_SCALAR[t], v)


def write(path, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)], arrays as (ARRAY, (elem_type, [items])).
    tensors: [(name, ggml_type, shape_row_major, raw_bytes)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += _str(k) + struct.pack("<I", t) + _value(t, v)
    off = 0
    offsets = []
    for name, gt, shape, raw in tensors:
        off = (off + alignment - 1) // alignment * alignment
        offsets.append(off)
        ne = list(reversed(shape))
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, off)
        off += len(raw)
    pad = (-len(out)) % alignment
    out += b"\0" * pad
    base = len(out)
    for (name, gt, shape, raw), o in zip(tensors, offsets):
        out += b"\0" * (base + o - len(out))
        out += raw
    with open(path, "wb") as f:
        f.write(bytes(out))


def read(path):
    """Returns (kv dict, {name: (ggml_type, row-major shape, raw bytes)}, data offset)."""
    with open(path, "rb") as f:
        b = f.read()
    p = [0]

    def take(fmt):
        v = struct.unpack_from(fmt, b, p[0])
        p[0] += struct.calcsize(fmt)
        return v[0]

    def s():
        n = take("<Q")
        v = b[p[0]:p[0] + n].decode("utf-8", "replace")
        p[0] += n
        return v

    def val(t):
        if t == STRING:
            return s()
        if t == ARRAY:
            et, n = take("<I"), take("<Q")
            return [val(et) for _ in range(n)]
        return take(_SCALAR[t])

    assert b[:4] == b"GGUF"
    p[0] = 4
    ver, nt, nkv = take("<I"), take("<Q"), take("<Q")
    assert ver == 3
    kv = {}
    for _ in range(nkv):
        k = s()
        t = take("<I")
        kv[k] = (t, val(t))
    infos = []
    for _ in range(nt):
        name = s()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        gt, off = take("<I"), take("<Q")
        infos.append((name, ne, gt, off))
    al = kv.get("general.alignment", (U32, 32))[1]
    base = (p[0] + al - 1) // al * al
    tensors = {}
    for name, ne, gt, off in infos:
        shape = list(reversed(ne))
        n = int(np.prod(shape))
        nbytes = {T_F32: 4 * n, T_F16: 2 * n, T_BF16: 2 * n, T_Q8_0: n // 32 * 34, T_Q4_0: n // 32 * 18}.get(gt)
        raw = b[base + off: base + off + nbytes] if nbytes is not None else None
        tensors[name] = (gt, shape, raw)
    return kv, tensors, base


def to_f32(gt, shape, raw):
    if gt == T_F32:
        return np.frombuffer(raw, "<f4").reshape(shape).copy()
    if gt == T_F16:
        return np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape)
    if gt == T_BF16:
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if gt == T_Q8_0:
        blk = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "i1", 32)]))
        return (blk["d"].astype(np.float32)[:, None] * blk["q"].astype(np.float32)).reshape(shape)
    raise ValueError(f"type {gt} not handled")


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack_from("<Q", b, 0)[0]
    h = json.loads(b[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in h.items():
        if name == "__metadata__":
            continue
        s, e = t["data_offsets"]
        raw = b[base + s: base + e]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float32)
        else:
            a = np.frombuffer(raw, "<f4").copy()
        out[name] = a.reshape(t["shape"])
    return out


def gguf_name(hf):
    """HF Dory tensor name -> llama.cpp's GGUF name."""
    fixed = {"backbone.embeddings.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "lm_head.logit_scale": "dory_logit_scale.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    i, rest = parts[2], ".".join(parts[3:])
    role = {"mixer.q_proj.weight": "attn_q", "mixer.k_proj.weight": "attn_k",
            "mixer.v_proj.weight": "attn_v", "mixer.g_proj.weight": "attn_gate",
            "mixer.o_proj.weight": "attn_output", "mixer.sqk": "dory_sqk",
            "mixer.s_gate": "dory_s_gate", "attn_alpha": "dory_alpha", "mlp_alpha": "dory_alpha",
            "mixer.gate_proj.weight": "ffn_gate", "mixer.up_proj.weight": "ffn_up",
            "mixer.down_proj.weight": "ffn_down", "mixer.suv_gate": "dory_suv_gate",
            "mixer.suv_up": "dory_suv_up"}[rest]
    return f"blk.{i}.{role}.weight"


def dory_kvs(cfg):
    """llama.cpp's Dory keys (convert_hf_to_gguf's DoryModel) from a config.json dict."""
    h = cfg
    n = h["num_hidden_layers"]
    hd = h.get("attention_head_dim", h.get("head_dim"))
    kv = [("general.architecture", STRING, "dory"),
          ("general.name", STRING, "tiny-independent"),
          ("dory.block_count", U32, n),
          ("dory.context_length", U32, h.get("max_position_embeddings", 8192)),
          ("dory.embedding_length", U32, h["hidden_size"]),
          ("dory.feed_forward_length", U32, h["intermediate_size"]),
          ("dory.attention.head_count", U32, h["num_attention_heads"]),
          ("dory.attention.head_count_kv", U32, h["num_key_value_heads"]),
          ("dory.attention.key_length", U32, hd),
          ("dory.attention.value_length", U32, hd),
          ("dory.rope.dimension_count", U32, hd),
          ("dory.rope.freq_base", F32, float(h["rope_theta"])),
          ("dory.attention.sliding_window", U32, h["swa_window_size"]),
          ("dory.input_layer_count", U32, h["n_input_layers"]),
          ("dory.recurrent_layer_count", U32, h["n_recurrent_layers"]),
          ("dory.output_layer_count", U32, h["n_output_layers"]),
          ("dory.recurrent_loop_count", U32, h["n_recurrent_loops"]),
          ("dory.layer_pattern", STRING, h["hybrid_layer_pattern"]),
          ("dory.recurrent_kv_cache_mode", STRING, h.get("recurrent_kv_cache_mode", "per_loop")),
          ("dory.rope.profile", ARRAY, (I32, list(h.get("rope_profile_layers", [1] * n)))),
          ("dory.rope.freq_base_2", F32, float(h.get("rope_theta_2", h["rope_theta"]))),
          ("dory.init_std", F32, float(h["init_method_std"])),
          ("dory.alpha_init", F32, float(h["ngpt_alpha_init"])),
          ("dory.gate_init", F32, float(h.get("attention_output_gate_logit_scale_init") or h["hidden_size"] ** 0.5)),
          ("general.alignment", U32, 64)]
    return kv
