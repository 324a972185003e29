#!/usr/bin/python3
"""Write the fuzzing seed inputs: small valid files of each format, from the test data.

Usage: /usr/bin/python3 fuzz/make_seeds.py --out DIR --dory build/dory

Writes DIR/<harness>/seed_* for the harnesses safetensors, config, gguf, tokenizer and
template. The seeds are where fuzzing starts; what is committed under fuzz/corpus/ is the
corpus libFuzzer grew from them, minimized with -merge=1 (see fuzz/README.md). The files
are kept small (a few KiB each) so that mutations stay cheap:
  - safetensors / config: a micro Dory (hidden 8, 3 layers, vocab 16) and variants made by
    scripts/make_checkpoint.py, plus the presets' config.json;
  - gguf: that micro model converted by `dory convert` (bf16, f32, q8_0 and, at hidden 256
    so whole K blocks fit, q4_k_m), with a shrunken byte-level tokenizer embedded;
  - tokenizer: the four tokenizers of tests/data/tokenizers and the variants, shrunken to a
    few hundred tokens (merges kept when both parts and the result survive), each followed
    by NUL, a text to encode, NUL, its tokenizer_config.json; plus normalizer and
    pre-tokenizer variants;
  - template: every template of tests/data/templates, and the snippets of
    tests/template/test_jinja_features.py with their contexts (TEMPLATE NUL CONTEXT_JSON).
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "tests", "data", "tokenizers")

MICRO = {
    "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
    "attention_head_dim": 4, "vocab_size": 16, "hybrid_layer_pattern": "S*-",
    "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1, "swa_window_size": 2,
    "max_position_embeddings": 16,
}


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def checkpoint(out, sets=None, extra=()):
    args = [sys.executable, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", out, "--quiet"]
    for k, v in {**MICRO, **(sets or {})}.items():
        args += ["--set", "%s=%s" % (k, json.dumps(v))]
    subprocess.run(args + list(extra), check=True)
    return out


def shrink_tokenizer(j, n_vocab=400, n_added=10):
    """Keep the first n_added added tokens and the first n_vocab other ids, renumbered
    densely in id order; merges whose parts and result all survive; ids fixed up."""
    j = copy.deepcopy(j)
    added = j.get("added_tokens", [])[:n_added]
    added_ids = {t["id"] for t in added}
    vocab = j["model"]["vocab"]
    others = sorted(i for i in vocab.values() if i not in added_ids)[:n_vocab]
    keep = sorted(added_ids | set(others))
    remap = {old: new for new, old in enumerate(keep)}
    j["model"]["vocab"] = {t: remap[i] for t, i in sorted(vocab.items(), key=lambda x: x[1]) if i in remap}
    kept = set(j["model"]["vocab"])
    merges = []
    for m in j["model"].get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
    j["model"]["merges"] = merges
    nxt = len(keep)
    for t in added:
        if t["id"] in remap:
            t["id"] = remap[t["id"]]
        else:
            remap[t["id"]] = t["id"] = nxt
            nxt += 1
    j["added_tokens"] = added

    def fix(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "ids" and isinstance(v, list):
                    node[k] = [remap.get(i, 0) for i in v]
                elif k == "id" and isinstance(v, int) and not isinstance(v, bool):
                    node[k] = remap.get(v, 0)
                else:
                    fix(v)
        elif isinstance(node, list):
            for x in node:
                fix(x)

    fix(j.get("post_processor"))
    return j


def first_texts(golden, n=2, limit=300):
    out = []
    with open(golden, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            if t:
                out.append(t[:limit])
            if len(out) == n:
                break
    return out


def dumps(j):
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


def tokenizer_seeds(out):
    bases = {}
    for name in ("gpt2", "llama3-131k", "sp-bpe", "sp-metaspace"):
        d = os.path.join(TOK, name)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            j = shrink_tokenizer(json.load(f))
        bases[name] = j
        with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = f.read()
        texts = first_texts(os.path.join(d, "golden.jsonl"))
        write(os.path.join(out, "seed_%s" % name), dumps(j))
        for k, t in enumerate(texts):
            write(os.path.join(out, "seed_%s_text%d" % (name, k)), dumps(j) + "\0" + t + "\0" + cfg)
    vdir = os.path.join(TOK, "variants")
    for v in sorted(os.listdir(vdir)):
        with open(os.path.join(vdir, v, "patch.json"), encoding="utf-8") as f:
            p = json.load(f)
        j = copy.deepcopy(bases[p["base"]])
        j.update(p["patch"])
        write(os.path.join(out, "seed_variant_%s" % v), dumps(j))
    gpt2 = bases["gpt2"]
    variants = {
        "nfkc_lower": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}},
        "nfd_strip": {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "Strip", "strip_left": True, "strip_right": True}]}},
        "nfc_replace": {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}]}},
        "nfkd": {"normalizer": {"type": "NFKD"}},
        "pre_whitespace": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Whitespace"}, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}},
        "pre_digits": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, {"type": "WhitespaceSplit"},
            {"type": "CharDelimiterSplit", "delimiter": ","},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}},
        "split_behaviors": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{N}+"}, "behavior": "Removed", "invert": True},
            {"type": "Split", "pattern": {"Regex": "(?=[A-Z])"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"String": "e"}, "behavior": "Contiguous", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]}},
        "bert": {"post_processor": {"type": "BertProcessing", "sep": ["<|im_end|>", 7], "cls": ["<|im_start|>", 6]}},
        "roberta": {"post_processor": {"type": "RobertaProcessing", "sep": ["<|im_end|>", 7],
                                       "cls": ["<|im_start|>", 6], "trim_offsets": True, "add_prefix_space": True}},
        "bpe_decoder": {"decoder": {"type": "Sequence", "decoders": [
            {"type": "BPEDecoder", "suffix": "</w>"}, {"type": "ByteLevel"}]}},
    }
    for name, patch in variants.items():
        j = copy.deepcopy(gpt2)
        j.update(patch)
        write(os.path.join(out, "seed_gpt2_%s" % name),
              dumps(j) + "\0" + "Hello WORLD, caf\u00e9 \uff21\uff22 12345 \u212b e\u0301\t\n x")


def template_seeds(out):
    tdir = os.path.join(ROOT, "tests", "data", "templates")
    for f in sorted(os.listdir(tdir)):
        with open(os.path.join(tdir, f), "rb") as fh:
            write(os.path.join(out, "seed_%s" % f), fh.read())
    sys.path.insert(0, os.path.join(ROOT, "tests", "template"))
    import test_jinja_features as feat  # noqa: E402  (SNIPPETS and CTX only)
    k = 0
    for group, items in sorted(feat.SNIPPETS.items()):
        for item in items:
            src, extra = (item, {}) if isinstance(item, str) else (item[0], item[1] or {})
            ctx = dict(feat.CTX)
            ctx.update(extra)
            write(os.path.join(out, "seed_snippet_%s_%03d" % (group, k)),
                  src + "\0" + json.dumps(ctx, ensure_ascii=False))
            k += 1


def model_seeds(out, dory):
    with tempfile.TemporaryDirectory(prefix="dory_seeds_") as tmp:
        st, cfg = os.path.join(out, "safetensors"), os.path.join(out, "config")
        variants = {
            "bf16": ({}, []),
            "f32": ({}, ["--dtype", "f32"]),
            "f16_lastloop_g0": ({"recurrent_kv_cache_mode": "last_loop",
                                 "attention_output_gate_logit_scale_init": 2.5}, ["--dtype", "f16"]),
            "partial_rotary": ({"partial_rotary_factor": 0.5, "partial_rotary_factor_2": 0.5,
                                "bos_token_id": [1, 3], "eos_token_id": [2, 4]}, []),
        }
        for name, (sets, extra) in variants.items():
            d = checkpoint(os.path.join(tmp, name), sets, extra)
            with open(os.path.join(d, "model.safetensors"), "rb") as f:
                write(os.path.join(st, "seed_micro_%s.safetensors" % name), f.read())
            with open(os.path.join(d, "config.json"), "rb") as f:
                write(os.path.join(cfg, "seed_micro_%s.json" % name), f.read())
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import make_checkpoint as mc  # noqa: E402  (config text of the presets)
        for preset in ("tiny", "4b"):
            write(os.path.join(cfg, "seed_preset_%s.json" % preset),
                  mc.config_text(mc.build_config(preset, {}, [], "bf16")))

        # GGUF: the micro model with a shrunken byte-level tokenizer beside it.
        gg = os.path.join(out, "gguf")
        with open(os.path.join(TOK, "gpt2", "tokenizer.json"), encoding="utf-8") as f:
            tj = shrink_tokenizer(json.load(f), n_vocab=120, n_added=4)
        with open(os.path.join(TOK, "gpt2", "tokenizer_config.json"), encoding="utf-8") as f:
            tc = f.read()
        for name, sets, types in (("micro", {"vocab_size": 128}, ("bf16", "f32", "q8_0")),
                                  ("h256", {"vocab_size": 128, "hidden_size": 256}, ("q4_k_m",))):
            d = checkpoint(os.path.join(tmp, "gguf_" + name), sets)
            write(os.path.join(d, "tokenizer.json"), dumps(tj))
            write(os.path.join(d, "tokenizer_config.json"), tc)
            for t in types:
                path = os.path.join(tmp, "%s_%s.gguf" % (name, t))
                if t in ("bf16", "f32"):
                    subprocess.run([dory, "convert", d, path, "--type", t], check=True, capture_output=True)
                else:
                    src = os.path.join(tmp, "%s_src.gguf" % name)
                    if not os.path.exists(src):
                        subprocess.run([dory, "convert", d, src, "--type", "f32"], check=True,
                                       capture_output=True)
                    subprocess.run([dory, "quantize", src, path, "--type", t], check=True,
                                   capture_output=True)
                with open(path, "rb") as f:
                    write(os.path.join(gg, "seed_%s_%s.gguf" % (name, t)), f.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dory", required=True, help="the dory binary (for convert / quantize)")
    a = ap.parse_args()
    tokenizer_seeds(os.path.join(a.out, "tokenizer"))
    template_seeds(os.path.join(a.out, "template"))
    model_seeds(a.out, a.dory)
    for h in sorted(os.listdir(a.out)):
        files = os.listdir(os.path.join(a.out, h))
        size = sum(os.path.getsize(os.path.join(a.out, h, f)) for f in files)
        print("%-12s %4d seeds, %7d bytes" % (h, len(files), size))


if __name__ == "__main__":
    main()
