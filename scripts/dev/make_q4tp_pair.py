#!/usr/bin/python3
# A mid-size random Dory as GGUF Q4_0 (dory quantize) and as CMF q4tp (numpy's encoder from
# tests/cmf/cmf_writer.py): the same weights, for an interleaved decode benchmark.
# Writes /tmp/q4b/{hf, q4_0.gguf, cmf/model.cmf}. Needs numpy: /usr/bin/python3.
import json, os, subprocess, sys
import numpy as np
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cmf")); sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
import cmf_writer as W, st_np as ST
src = "/tmp/q4b/hf"
if not os.path.isdir(src):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", src, "--quiet",
                    "--set", "hidden_size=2048", "--set", "intermediate_size=5632", "--set", "attention_head_dim=128",
                    "--set", "num_attention_heads=16", "--set", "num_key_value_heads=4", "--set", "vocab_size=32000",
                    "--set", "max_position_embeddings=4096", "--set", "swa_window_size=1024"], check=True)
cfg = json.load(open(os.path.join(src, "config.json")))
arch = {"arch_name": "dory", "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
        "num_layers": cfg["num_hidden_layers"], "num_attention_heads": cfg["num_attention_heads"],
        "num_kv_heads": cfg["num_key_value_heads"], "head_dim": cfg["attention_head_dim"], "vocab_size": cfg["vocab_size"]}
files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
entries = []
for f in files:
    for name, (dt, shape, raw) in sorted(ST.read(os.path.join(src, f)).items()):
        w = ST.to_f32(dt, shape, raw).reshape(shape)
        if len(shape) == 2 and shape[1] % 32 == 0:
            entries.append((name, W.Q4TP, tuple(shape), W.enc_tp(w, 4)))
        else:
            entries.append((name, W.F32, tuple(shape), w.astype(np.float32).tobytes()))
os.makedirs("/tmp/q4b/cmf", exist_ok=True)
import shutil; shutil.copy(os.path.join(src, "config.json"), "/tmp/q4b/cmf")
W.write("/tmp/q4b/cmf/model.cmf", entries, arch=arch, quant_type="Q4TP")
subprocess.run([os.environ.get("DORY_BIN", os.path.join(ROOT, "build", "dory")), "quantize", src, "/tmp/q4b/q4_0.gguf", "--type", "q4_0", "-q"], check=True)
print("ok", os.path.getsize("/tmp/q4b/cmf/model.cmf"), os.path.getsize("/tmp/q4b/q4_0.gguf"))
