"""safetensors in numpy, for the Python suites: read any file a checkpoint script writes (BF16,
F16, F32), write F32 ones."""
import json
import struct

import numpy as np


def read(path):
    """{name: (dtype string, shape, raw bytes)}"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


def to_f32(dtype, shape, raw):
    if dtype == "BF16":
        arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F16":
        arr = np.frombuffer(raw, np.float16).astype(np.float32)
    else:
        arr = np.frombuffer(raw, np.float32)
    return arr.reshape(shape).copy()


def write_f32(path, tensors):
    """tensors: {name: array}, written as F32."""
    header, blob = {}, b""
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + blob)


def tiny_checkpoint(prefix):
    """A fresh temporary directory holding the tiny random checkpoint (scripts/make_checkpoint.py);
    returns (that directory, the checkpoint's path, its config.json as a dict). Needs DORY_BIN."""
    import os
    import subprocess
    import tempfile
    dory = os.environ.get("DORY_BIN", "")
    if not dory or not os.access(dory, os.X_OK):
        raise RuntimeError("DORY_BIN must name the dory binary")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tempfile.mkdtemp(prefix=prefix)
    out = os.path.join(tmp, "tiny")
    subprocess.run(["/usr/bin/python3", os.path.join(root, "scripts", "make_checkpoint.py"), "--out", out, "--quiet"],
                   check=True)
    with open(os.path.join(out, "config.json")) as f:
        return tmp, out, json.load(f)
