#!/usr/bin/env python3
"""Trains the test tokenizers and writes their golden ids, on a machine that has Hugging Face
`tokenizers` (made with 0.23.2). Everything under tests/data/tokenizers comes from here.

    python3 scripts/tokenizers/train_and_golden.py --corpus .tokcorpus \
        --strings .tokcorpus/strings.jsonl --out OUTDIR

Inputs come from prepare_corpus.py (the corpus) and make_strings.py (the test strings).
Writes OUTDIR/tokenizers/<name>/{tokenizer.json, tokenizer_config.json, golden.jsonl,
decode.jsonl} for the four base files and OUTDIR/tokenizers/variants/<name>/{patch.json,
golden.jsonl} for variants that replace top-level keys of a base file (other pre-tokenizers,
normalizers and post-processors on the same vocabulary, to keep the test data small).

  gpt2          GPT-2 style byte-level BPE: ByteLevel pre-tokenizer (its built-in regex), 50257
                ids, merges as "a b" strings, added tokens with lstrip/rstrip/single_word/
                normalized flags.
  llama3-131k   Llama-3/Tekken style: Split on the Llama-3 regex + ByteLevel without regex,
                ignore_merges, 1000 special tokens first (Tekken's layout), 131072 ids, merges
                as [a, b] pairs, TemplateProcessing "<s> $A".
  sp-bpe        Llama-2 style SentencePiece BPE: Prepend/Replace normalizer, no pre-tokenizer,
                byte_fallback with <0xNN> tokens, unk fused, Replace/ByteFallback/Fuse/Strip
                decoder, 32000 ids + 2 added.
  sp-metaspace  The same vocabulary behind a Metaspace pre-tokenizer (prepend_scheme first,
                split) and a ByteFallback + Metaspace decoder, BOS and EOS.

golden.jsonl, one object per test string: text, ids (add_special_tokens=False), ids_special
(True), decoded (decode(ids)), decoded_skip (decode(ids_special, skip_special_tokens=True)),
and ids_nosplit (encode_special_tokens=True) where it differs from ids.
decode.jsonl: random id sequences (partial UTF-8, byte tokens, specials, unknown ids) with
decoded and decoded_skip.
"""
import argparse
import concurrent.futures as cf
import glob
import gzip
import json
import os
import random
import sys
import time
import traceback

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


def corpus_chunks(corpus, lines_per_chunk=16, max_bytes=None):
    total = 0
    for p in sorted(glob.glob(os.path.join(corpus, "*.txt.gz"))):
        with gzip.open(p, "rt", encoding="utf-8") as f:
            buf = []
            for line in f:
                buf.append(line.rstrip("\n"))
                if len(buf) == lines_per_chunk:
                    s = "\n".join(buf)
                    total += len(s)
                    yield s
                    buf = []
                    if max_bytes and total > max_bytes:
                        break
            if buf:
                yield "\n".join(buf)


def train(name, corpus, workdir):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers, processors
    t0 = time.time()
    if name == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tr = trainers.BpeTrainer(vocab_size=50257, special_tokens=["<|endoftext|>"], show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif name == "llama3-131k":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<|im_start|>", "<|im_end|>",
                    "<|begin_of_text|>", "<|eot_id|>", "<pad>"]
        specials += [f"<SPECIAL_{i}>" for i in range(len(specials), 1000)]
        tr = trainers.BpeTrainer(vocab_size=131072, special_tokens=specials, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif name == "sp":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        tr = trainers.BpeTrainer(vocab_size=32000, special_tokens=specials, show_progress=False,
                                 limit_alphabet=1500, min_frequency=2)
    else:
        raise ValueError(name)
    tok.train_from_iterator(corpus_chunks(corpus), tr)
    path = os.path.join(workdir, name + ".raw.json")
    tok.save(path)
    return name, path, time.time() - t0, tok.get_vocab_size()


def template(single_specials_before, single_specials_after, ids):
    def st(n, t):
        return {"SpecialToken": {"id": n, "type_id": t}}
    single = [st(n, 0) for n in single_specials_before] + [{"Sequence": {"id": "A", "type_id": 0}}] + \
             [st(n, 0) for n in single_specials_after]
    pair = single + [st(n, 1) for n in single_specials_before] + [{"Sequence": {"id": "B", "type_id": 1}}] + \
           [st(n, 1) for n in single_specials_after]
    names = set(single_specials_before) | set(single_specials_after)
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {n: {"id": n, "ids": [ids[n]], "tokens": [n]} for n in sorted(names)}}


def added(id_, content, special, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def finish(raw):
    """Base tokenizer.json dicts from the trained raw files."""
    out = {}
    # gpt2: "a b" merges, extra added tokens exercising every flag.
    d = json.load(open(raw["gpt2"]))
    d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    vocab = d["model"]["vocab"]
    n = max(vocab.values()) + 1
    extra = [("<|im_start|>", dict(special=True)), ("<|im_end|>", dict(special=True)),
             ("<sep>", dict(special=True, lstrip=True, rstrip=True)),
             ("<mask>", dict(special=False, lstrip=True, normalized=True)),
             ("[WORD]", dict(special=False, single_word=True)),
             ("Hello", dict(special=False, single_word=True, normalized=True))]
    for content, kw in extra:
        if content in vocab:
            d["added_tokens"].append(added(vocab[content], content, **kw))
        else:
            d["added_tokens"].append(added(n, content, **kw))
            n += 1
    out["gpt2"] = d
    # llama3-131k: [a, b] merges, template "<s> $A".
    d = json.load(open(raw["llama3-131k"]))
    d["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else m for m in d["model"]["merges"]]
    d["model"]["ignore_merges"] = True
    d["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        template(["<s>"], [], {"<s>": d["model"]["vocab"]["<s>"]})]}
    out["llama3-131k"] = d
    # sp-bpe: Llama-2 layout. Byte tokens stay in the model's vocab only.
    d = json.load(open(raw["sp"]))
    d["added_tokens"] = [t for t in d["added_tokens"] if not t["content"].startswith("<0x")]
    d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    vocab = d["model"]["vocab"]
    n = max(vocab.values()) + 1
    d["added_tokens"] += [added(n, "<|im_start|>", True), added(n + 1, "<|im_end|>", True)]
    d["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    d["pre_tokenizer"] = None
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    d["post_processor"] = template(["<s>"], [], {"<s>": vocab["<s>"]})
    out["sp-bpe"] = d
    # sp-metaspace: same vocabulary, Metaspace pre-tokenizer and decoder, pair merges, BOS+EOS.
    d2 = json.loads(json.dumps(d))
    d2["model"]["merges"] = [m.split(" ", 1) for m in d["model"]["merges"]]
    d2["normalizer"] = None
    d2["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    d2["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}]}
    d2["post_processor"] = template(["<s>"], ["</s>"], {"<s>": vocab["<s>"], "</s>": vocab["</s>"]})
    out["sp-metaspace"] = d2
    return out


def configs():
    def ad(c):
        return {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False, "special": True}
    return {
        "gpt2": {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                 "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
                 "model_max_length": 1024, "chat_template": CHATML},
        "llama3-131k": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                        "eos_token": "</s>", "model_max_length": 131072,
                        "chat_template": [{"name": "default", "template": CHATML},
                                          {"name": "tool_use", "template": "{{ raise_exception('no tools') }}"}]},
        "sp-bpe": {"tokenizer_class": "LlamaTokenizerFast", "bos_token": ad("<s>"), "eos_token": ad("</s>"),
                   "unk_token": ad("<unk>"), "add_bos_token": True, "add_eos_token": False,
                   "legacy": True, "model_max_length": 4096, "chat_template": CHATML},
        "sp-metaspace": {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                         "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": True,
                         "legacy": False, "model_max_length": 4096, "chat_template": CHATML},
    }


def variants(base):
    """Patches: top-level keys that replace a base file's."""
    bl = lambda prefix, regex: {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
                                "use_regex": regex}
    split = lambda pat, behavior, invert=False: {"type": "Split", "pattern": pat, "behavior": behavior,
                                                 "invert": invert}
    eot = base["gpt2"]["model"]["vocab"]["<|endoftext|>"]
    return {
        "gpt2-prefix": {"base": "gpt2", "patch": {
            "pre_tokenizer": bl(True, True),
            "post_processor": template(["<|endoftext|>"], ["<|endoftext|>"], {"<|endoftext|>": eot})}},
        "gpt2-splits": {"base": "gpt2", "patch": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split({"Regex": r"\s+"}, "MergedWithPrevious"),
            {"type": "Digits", "individual_digits": True},
            split({"Regex": r"[A-Z][a-z]*"}, "MergedWithNext"),
            bl(False, False)]}}},
        "gpt2-removed": {"base": "gpt2", "patch": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split({"String": "-"}, "Removed"),
            split({"Regex": r"\p{P}+"}, "Contiguous"),
            {"type": "Digits", "individual_digits": False},
            split({"Regex": r"\w+|\s"}, "Removed", invert=True),
            bl(True, True)]}}},
        "sp-strip": {"base": "sp-bpe", "patch": {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}}},
    }


def golden_lines(tok, strings):
    lines = []
    for s in strings:
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_sp = tok.encode(s, add_special_tokens=True).ids
        rec = {"text": s, "ids": ids, "ids_special": ids_sp,
               "decoded": tok.decode(ids, skip_special_tokens=False),
               "decoded_skip": tok.decode(ids_sp, skip_special_tokens=True)}
        tok.encode_special_tokens = True
        ns = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        if ns != ids:
            rec["ids_nosplit"] = ns
        lines.append(json.dumps(rec, ensure_ascii=False))
    return lines


def decode_lines(tok, d, rng, n=400):
    vocab = d["model"]["vocab"]
    size = tok.get_vocab_size(with_added_tokens=True)
    specials = [t["id"] for t in d["added_tokens"]]
    short = [i for t, i in vocab.items() if len(t) == 1 or t.startswith("<0x")]
    lines = []
    for k in range(n):
        m = rng.randrange(1, 24)
        ids = []
        for _ in range(m):
            r = rng.random()
            if r < 0.35:
                ids.append(rng.choice(short))
            elif r < 0.45:
                ids.append(rng.choice(specials))
            elif r < 0.47:
                ids.append(size + rng.randrange(1, 50))
            else:
                ids.append(rng.randrange(size))
        lines.append(json.dumps({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                                 "decoded_skip": tok.decode(ids, skip_special_tokens=True)},
                                ensure_ascii=False))
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--strings", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/tokwork")
    args = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer
    log("tokenizers", tokenizers.__version__, "python", sys.version.split()[0])
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    raw = {}
    with cf.ProcessPoolExecutor(3) as ex:
        futs = [ex.submit(train, n, args.corpus, args.work) for n in ("llama3-131k", "gpt2", "sp")]
        for f in cf.as_completed(futs):
            try:
                name, path, secs, vs = f.result()
                raw[name] = path
                log(f"trained {name}: vocab {vs} in {secs:.1f}s")
            except Exception:
                log("TRAIN FAILED", traceback.format_exc())
    log(f"training done at {time.time() - t0:.1f}s")
    strings = [json.loads(l) for l in open(args.strings, encoding="utf-8")]
    base = finish(raw)
    cfgs = configs()
    root = os.path.join(args.out, "tokenizers")
    rng = random.Random(424242)
    for name, d in base.items():
        try:
            text = json.dumps(d, ensure_ascii=False, indent=None, separators=(",", ":"))
            tok = Tokenizer.from_str(text)
            dd = os.path.join(root, name)
            os.makedirs(dd, exist_ok=True)
            # Saved by the library itself, so the file is exactly what it reads.
            tok.save(os.path.join(dd, "tokenizer.json"), pretty=False)
            saved = json.load(open(os.path.join(dd, "tokenizer.json")))
            # The library re-serializes merges as pairs; keep the form this file is meant to test.
            saved["model"]["merges"] = d["model"]["merges"]
            with open(os.path.join(dd, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(saved, f, ensure_ascii=False, separators=(",", ":"))
            tok = Tokenizer.from_file(os.path.join(dd, "tokenizer.json"))
            with open(os.path.join(dd, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(cfgs[name], f, ensure_ascii=False, indent=2)
            g = golden_lines(tok, strings)
            open(os.path.join(dd, "golden.jsonl"), "w", encoding="utf-8").write("\n".join(g) + "\n")
            dl = decode_lines(tok, saved, rng)
            open(os.path.join(dd, "decode.jsonl"), "w", encoding="utf-8").write("\n".join(dl) + "\n")
            log(f"{name}: vocab {tok.get_vocab_size(True)}, {len(g)} golden, "
                f"{os.path.getsize(os.path.join(dd, 'tokenizer.json')) / 1e6:.2f} MB json")
        except Exception:
            log("BASE FAILED", name, traceback.format_exc())
    for vname, v in variants(base).items():
        try:
            d = json.loads(json.dumps(base[v["base"]]))
            d.update(v["patch"])
            tok = Tokenizer.from_str(json.dumps(d, ensure_ascii=False))
            dd = os.path.join(root, "variants", vname)
            os.makedirs(dd, exist_ok=True)
            with open(os.path.join(dd, "patch.json"), "w", encoding="utf-8") as f:
                json.dump(v, f, ensure_ascii=False, indent=1)
            g = golden_lines(tok, strings[::5])
            open(os.path.join(dd, "golden.jsonl"), "w", encoding="utf-8").write("\n".join(g) + "\n")
            log(f"variant {vname}: {len(g)} golden")
        except Exception:
            log("VARIANT FAILED", vname, traceback.format_exc())
    log(f"all done at {time.time() - t0:.1f}s")
    open(os.path.join(args.out, "log.txt"), "w").write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
