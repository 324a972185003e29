#!/usr/bin/env python3
"""Trains the built-in Dory model (models/dory-mini) on one NVIDIA GPU.

One command, fixed seed, about 10 minutes on an H200 (tokenizer ~20 s, training, export,
reference logits, evaluation):

    python3 scripts/train/train.py --data .traindata --out OUT

Needs PyTorch with CUDA, `tokenizers` and numpy (not Debian's python: the GPU machine's).
The data comes from `scripts/train/prepare_data.py` (run on Debian, where the packages are).

Writes OUT/dory-mini/{config.json, model.safetensors, generation_config.json,
tokenizer.json, tokenizer_config.json}, OUT/dory-mini-ref.npz (the training code's own
float64 logits on held-out text for both KV modes and several loop counts and chunk
schedules: the engine's parity data) and OUT/train_log.json (losses, evaluation).

What it trains (docs/model.md section 1): input block "S-", recurrent block "S-*-S-*-" run 1-4
times (a random loop count per step, mostly 2, so one loop is usable for early exit and
more loops do not fall apart), output block "*-"; hidden 256, 4 query heads and 2 KV
heads of 64, SwiGLU 768, vocabulary 4096, sliding window 256, context 4096. About 7.2M
parameters, 14 MB in bf16. A quarter of the training rows are pass-key examples: a
five-digit key planted at a random depth of 300-4000 tokens of real text and asked for
at the end, so the full-attention layers learn to carry retrieval.
"""
import argparse
import gzip
import json
import math
import os
import random
import re
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# The GPU machine trains on CUDA; without one (Debian 12's python3-torch) the same code runs
# on the CPU, for short smoke runs of the script (`--steps 3 --ctx 256 --batch 2 --compile 0`).
DEV = "cuda" if torch.cuda.is_available() else "cpu"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dory_torch import Cached, Dory  # noqa: E402
from make_checkpoint import FIXED_KEYS  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT, IM_START, IM_END = 0, 1, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

CONFIG = {
    **FIXED_KEYS,  # the keys vLLM checks, as every Dory checkpoint has them
    "torch_dtype": "bfloat16",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_head_dim": 64,
    "head_dim": 64,
    "vocab_size": 4096,
    "num_hidden_layers": 12,
    "hybrid_layer_pattern": "S-" + "S-*-S-*-" + "*-",
    "n_input_layers": 2,
    "n_recurrent_layers": 8,
    "n_output_layers": 2,
    "n_recurrent_loops": 2,
    "recurrent_kv_cache_mode": "per_loop",
    "swa_window_size": 256,
    "rope_theta": 10000.0,
    "rope_theta_2": 500000.0,
    "rope_profile_layers": None,  # filled in: S layers 1, full layers 2
    "partial_rotary_factor": 1.0,
    "partial_rotary_factor_2": 1.0,
    "init_method_std": 0.02,
    "ngpt_alpha_init": 0.05,
    "attention_output_gate_logit_scale_init": None,
    "max_position_embeddings": 4096,
    "bos_token_id": EOT,
    "eos_token_id": EOT,
}
CONFIG["rope_profile_layers"] = [2 if ch == "*" else 1 for ch in CONFIG["hybrid_layer_pattern"]]

CHAT_PROMPTS = {
    "fortunes": ["Tell me a fortune.", "Say something wise.", "Tell me something funny.",
                 "Give me a quote.", "Cheer me up."],
    "bible": ["Quote a verse from the Bible.", "Read me a verse.", "Say a verse."],
}

PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of "
                 "irrelevant text. Find it and memorize it.\n")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_docs(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(docs, vocab_size, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    # Digits one by one (pass keys and numbers copy digit by digit), then GPT-2 byte level.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator((d["text"] for d in docs), trainer, length=len(docs))
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A <|endoftext|> $B",
        special_tokens=[("<|endoftext|>", EOT)])
    assert [tok.token_to_id(s) for s in SPECIALS] == [EOT, IM_START, IM_END]
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": CONFIG["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": EOT, "eos_token_id": [EOT, IM_END]}, f, indent=2)
    return tok


ASK_NAME = ["Who was {}?", "Tell me about {}.", "What do you know about {}?", "What happened to {}?",
            "Who is {}?"]
ASK_WORD = ["Tell me about {}.", "What do you think about {}?", "Say something about {}.",
            "What is {}?", "Why {}?", "What about {}?"]
NOT_NAMES = frozenset("And The Then But For Thus When Now Behold Wherefore Therefore Lord LORD God "
                      "Which What Who Let Yea Also Because After Before O I In As If So This That "
                      "These Those There Them They He She It We Ye Thou Thy Thine My His Her Our "
                      "Your Their Chapter CHAPTER Mr Mrs A An Of To On At By With From Is Was Are "
                      "Were Be Not No Yes All Some".split())


def chat_docs(docs, rng):
    """ChatML turns in the model's own template, so a chat turn gets an answer in form: the
    user asks (for a fortune, a verse, or about a name or word) and the assistant answers
    with one short text of its corpus that fits (a verse naming the person, a fortune or a
    sentence holding the word), then <|im_end|>: a short reply, not a new document."""
    out = []

    def turn(q, a):
        out.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n")

    for d in docs:
        src = d["src"]
        if src == "fortunes":
            if rng.random() < 0.3:
                turn(rng.choice(CHAT_PROMPTS["fortunes"]), d["text"])
            if rng.random() < 0.4 and len(d["text"]) < 400:
                words = [w for w in re.findall(r"[a-z]{5,}", d["text"])]
                if words:
                    turn(rng.choice(ASK_WORD).format(rng.choice(words)), d["text"])
            continue
        if src == "bible":
            verses = d["text"].split("\n")[2:]
            for _ in range(3):
                v = rng.choice(verses)
                if rng.random() < 0.3:
                    turn(rng.choice(CHAT_PROMPTS["bible"]), v)
                names = [w for w in re.findall(r"\b[A-Z][a-z]{2,}\b", v) if w not in NOT_NAMES]
                if names:
                    turn(rng.choice(ASK_NAME).format(rng.choice(names)), v)
            continue
        # Prose (brown, sotu, moby): a sentence that holds a word of the question.
        sents = [x for x in re.split(r"(?<=[.?!])\s+", d["text"].replace("\n", " ")) if 40 <= len(x) <= 300]
        for _ in range(4 if src != "sotu" else 2):
            if not sents:
                break
            sent = rng.choice(sents)
            words = re.findall(r"\b[a-z]{6,}\b", sent)
            if words:
                turn(rng.choice(ASK_WORD).format(rng.choice(words)), sent)
    return out


def encode_stream(tok, texts, rng):
    """One token stream: <|endoftext|> doc <|endoftext|> doc ... in a shuffled order."""
    texts = list(texts)
    rng.shuffle(texts)
    enc = tok.encode_batch(texts, add_special_tokens=False)
    parts = []
    for e in enc:
        parts.append([EOT])
        parts.append(e.ids)
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


# ---------------------------------------------------------------------------------------
# Pass-key examples: token templates whose key digits are rewritten at every use


class PassKeys:
    def __init__(self, tok, stream, rng, n_templates, min_len, max_len):
        self.digit_ids = [tok.token_to_id(str(d)) for d in range(10)]
        assert all(i is not None for i in self.digit_ids)
        ends_nl = np.zeros(tok.get_vocab_size(), dtype=bool)
        for t, i in tok.get_vocab().items():
            ends_nl[i] = t.endswith("\u010a")  # ByteLevel's "\n"
        self.cut = np.nonzero(ends_nl[stream] & (stream != EOT))[0] + 1  # after a "\n"
        self.stream = stream
        self.tok = tok
        # Log-uniform lengths: many short examples (retrieval is learnt there first),
        # enough long ones to carry it to the whole context.
        self.templates = [self._template(rng, int(math.exp(rng.uniform(math.log(min_len),
                                                                        math.log(max_len)))))
                          for _ in range(n_templates)]

    def pieces(self, key="00000"):
        enc = lambda s: self.tok.encode(s, add_special_tokens=False).ids  # noqa: E731
        intro = enc(PASSKEY_INTRO)
        needle = enc(f"The pass key is {key}. Remember it. {key} is the pass key.\n")
        question = enc("What is the pass key? The pass key is")
        answer = enc(f" {key}.\n")
        return intro, needle, question, answer

    def _filler(self, rng, n):
        """About n tokens of text from a random place, cut after newlines."""
        a = self.cut[rng.randrange(len(self.cut) - 1)]
        j = np.searchsorted(self.cut, a + max(n, 1))
        if j >= len(self.cut):
            return self._filler(rng, n)
        return self.stream[a:self.cut[j]]

    def _template(self, rng, length):
        intro, needle, question, answer = self.pieces()
        body = length - len(intro) - len(needle) - len(question) - len(answer)
        while True:  # fillers end at a newline, so they overshoot a little: draw again
            depth = rng.random()
            f1 = self._filler(rng, int(body * depth))
            f2 = self._filler(rng, body - len(f1))
            ids = np.concatenate([intro, f1, needle, f2, question, answer]).astype(np.int64)
            if len(ids) <= length:
                break
        digit_set = set(self.digit_ids)
        # Key positions: the three runs of five digit tokens inside needle and answer.
        base_n = len(intro) + len(f1)
        base_a = len(ids) - len(answer)
        pos = [base_n + i for i, t in enumerate(needle) if t in digit_set]
        pos += [base_a + i for i, t in enumerate(answer) if t in digit_set]
        assert len(pos) == 15, pos
        return ids, np.asarray(pos), base_a  # base_a: where the answer starts

    def sample(self, rng):
        ids, pos, ans = self.templates[rng.randrange(len(self.templates))]
        ids = ids.copy()
        key = [self.digit_ids[rng.randrange(10)] for _ in range(5)]
        ids[pos] = np.asarray(key * 3)
        return ids, ans


# ---------------------------------------------------------------------------------------
# Export


def read_safetensors(path):
    """The writer's counterpart (bf16, f16 and f32 tensors) -> {name: CPU tensor}."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
        blob = f.read()
    dt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(blob[a:b]), dtype=dt[v["dtype"]]).reshape(v["shape"]).clone()
    return out


def load_weights(model, model_dir, what=None):
    """A model directory's model.safetensors into `model` as float32 (the same config: a tensor
    missing or extra on either side stops with one line naming `what`, default the directory)."""
    sd = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    missing = set(model.state_dict()) ^ set(sd)
    if missing:
        sys.exit(f"{what or model_dir}: tensors differ from the model's: {sorted(missing)[:5]}")
    model.load_state_dict({k: v.float() for k, v in sd.items()})
    return model


def write_safetensors(path, tensors):
    """Minimal safetensors writer (bf16 and f32), header padded to 8 bytes."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
            dt = "BF16"
        else:
            raw = t.float().numpy().tobytes()
            dt = "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def export(model, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), sd)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    return sd


# ---------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def eval_loss(model, rows, loops):
    model.eval()
    tot, n = 0.0, 0
    for r in rows:
        x = torch.as_tensor(r[None], device=DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            lg = model.forward_any(x[:, :-1], loops)
        loss = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum")
        tot += float(loss)
        n += x.shape[1] - 1
    model.train()
    return tot / n


@torch.no_grad()
def eval_passkey(model, pk, rng, length, trials, loops):
    """Greedy 5-digit answers on held-out text: fraction exactly right."""
    model.eval()
    ok = 0
    for _ in range(trials):
        t = pk._template(rng, length)
        ids, pos, ans = t
        key = [pk.digit_ids[rng.randrange(10)] for _ in range(5)]
        ids = ids.copy()
        ids[pos] = np.asarray(key * 3)
        # <|endoftext|> first, as in training rows and as the engine's BOS.
        prompt = torch.as_tensor(np.concatenate([[EOT], ids[:ans]])[None], device=DEV)
        want = ids[ans:ans + 6]  # " " then five digits
        got = []
        for _ in range(len(want)):
            with torch.autocast(DEV, dtype=torch.bfloat16):
                lg = model.forward_any(prompt, loops)
            nxt = int(lg[0, -1].argmax())
            got.append(nxt)
            prompt = torch.cat([prompt, prompt.new_tensor([[nxt]])], dim=1)
        ok += got == list(want)
    model.train()
    return ok / trials


def reference_logits(model_dir_sd, model, val_stream, out_path):
    """The training code's own float64 forward on the exported (bf16) weights, through
    the cached inference schedule: the data tests/parity checks the engine against."""
    ref = Dory(CONFIG).double().eval()
    ref.load_state_dict({k: v.double() for k, v in model_dir_sd.items()})
    ids = val_stream[1000:1024].copy()
    ids[0] = EOT
    cases = {}

    def run(mode, loops, chunk):
        c = Cached(ref, mode, len(ids))
        outs = [c.feed(ids[a:a + chunk], loops) for a in range(0, len(ids), chunk)]
        return torch.cat(outs).float().numpy()

    for mode, loops, chunk in [("per_loop", 2, 24), ("per_loop", 1, 24), ("per_loop", 4, 24),
                               ("last_loop", 2, 1), ("last_loop", 2, 8), ("last_loop", 3, 5)]:
        cases[f"{mode}_loops{loops}_chunk{chunk}"] = run(mode, loops, chunk)
        log(f"reference {mode} loops={loops} chunk={chunk}")
    # per_loop does not depend on the chunking: a self-check of the reference itself.
    d = np.abs(run("per_loop", 2, 5) - cases["per_loop_loops2_chunk24"]).max()
    assert d < 1e-9, d
    np.savez(out_path, ids=ids.astype(np.int32), **cases)
    return cases


def self_check(sd, model_dir, val_stream):
    """Three implementations on the exported weights: the training path (forward(), fp32,
    blocked sliding window), the cached schedule (float64) and the numpy reference
    scripts/reference/dory_ref.py (float64, written from the formulas, shares no code)."""
    ref = Dory(CONFIG).double().eval()
    ref.load_state_dict({k: v.double() for k, v in sd.items()})
    ids = val_stream[5000:5000 + 512].copy()
    c = Cached(ref, "per_loop", len(ids))
    cached = c.feed(ids, 2).numpy()
    f32 = Dory(CONFIG).to(DEV).eval()
    f32.load_state_dict({k: v.float() for k, v in sd.items()})
    with torch.no_grad():
        seq = f32(torch.as_tensor(ids[None], device=DEV), 2, dtype=torch.float32)
    d_seq = float(np.abs(seq[0].cpu().numpy() - cached).max())
    out = {"train_path_vs_cached_f64": d_seq}
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
        import dory_ref
        short = ids[:40]
        for mode, chunk in (("per_loop", None), ("last_loop", 8)):
            npy = dory_ref.run(model_dir, short.tolist(), loops=2, kv=mode, chunk=chunk)
            c = Cached(ref, mode, len(short))
            k = chunk or len(short)
            mine = torch.cat([c.feed(short[a:a + k], 2) for a in range(0, len(short), k)]).numpy()
            out[f"cached_vs_numpy_ref_{mode}"] = float(np.abs(mine - npy).max())
    except ImportError as e:
        out["numpy_ref"] = f"not run: {e}"
    log(f"self-check (max |logit difference|): {out}")
    return out


# ---------------------------------------------------------------------------------------
# The task suite (tasks.py): ChatML question/answer items packed into training rows, the
# answers weighted, and greedy accuracy by loop count at the end.


class TaskRows:
    def __init__(self, tok, items):
        import tasks as TS
        full = tok.encode_batch([TS.chatml(it) for it in items], add_special_tokens=False)
        head = tok.encode_batch([TS.chatml(it, answer=False) for it in items], add_special_tokens=False)
        self.items = [(np.asarray(f.ids, dtype=np.int64), len(h.ids)) for f, h in zip(full, head)]

    def row(self, rng, T):
        """T + 1 ids: <|endoftext|> item <|endoftext|> item ..., and the answer positions."""
        ids, ans = [EOT], []
        while len(ids) < T + 1:
            it, a0 = self.items[rng.randrange(len(self.items))]
            base = len(ids)
            ids.extend(it.tolist())
            ids.append(EOT)
            ans.extend(range(base + a0, base + len(it)))
        return np.asarray(ids[:T + 1], dtype=np.int64), [p for p in ans if p <= T]


@torch.no_grad()
def eval_tasks(model, tok, items, loops, max_new=40):
    """Greedy answers to held-out task items through the chat template: fraction exactly right,
    per task and in all."""
    import tasks as TS
    model.eval()
    per = {}
    for it in items:
        ids = [EOT] + tok.encode(TS.chatml(it, answer=False), add_special_tokens=False).ids
        out = []
        for _ in range(max_new):
            x = torch.as_tensor([ids + out], device=DEV)
            with torch.autocast(DEV, dtype=torch.bfloat16):
                nxt = int(model.forward_any(x, loops)[0, -1].argmax())
            if nxt in (EOT, IM_END):
                break
            out.append(nxt)
        ok = tok.decode(out).strip() == it["a"]
        n, k = per.get(it["task"], (0, 0))
        per[it["task"]] = (n + 1, k + ok)
    model.train()
    res = {t: k / n for t, (n, k) in per.items()}
    res["all"] = sum(k for n, k in per.values()) / max(1, sum(n for n, k in per.values()))
    return res


def step_loss(model, rows, weights, loops, args, aux_at, done):
    """One training step's loss: the last pass's read-out against rows[:, 1:] (weights per
    position), plus what --aux1, --aux-at, --exit-distill and --exit-calibrate add; done is
    the share of training done (--aux1-from)."""
    # Read-outs before the last pass, each with its loss weight (None: read for
    # --exit-distill / --exit-calibrate only).
    aux_w = {}
    if args.aux1 > 0 and done >= args.aux1_from:
        aux_w[1] = args.aux1
    for k, w in aux_at.items():
        aux_w[k] = w
    if args.exit_distill > 0 or args.exit_calibrate > 0:
        aux_w.setdefault(1, None)
        aux_w.setdefault(2, None)
    aux = tuple(k for k in sorted(aux_w) if k < loops)
    model.hold_from = 2 if getattr(args, "hold", 0.0) > 0 else 0
    with torch.autocast(DEV, dtype=torch.bfloat16):
        if aux:
            logits, early = model(rows[:, :-1], loops, bptt=args.bptt, aux=aux)
        else:
            logits, early = model(rows[:, :-1], loops, bptt=args.bptt), []
    by_pass = dict(zip(aux, early))
    by_pass[loops] = logits
    tgt = rows[:, 1:].reshape(-1)

    def ce(lg):
        lt = F.cross_entropy(lg.float().view(-1, lg.shape[-1]), tgt, reduction="none")
        return (lt * weights.view(-1)).sum() / weights.sum()
    loss = ce(logits)
    for k in aux:
        # Earlier read-outs trained beside the last (--aux1: the exit gates let a token
        # out on the first; --aux-at: deep supervision, so more passes stay as good).
        if aux_w[k]:
            loss = loss + aux_w[k] * ce(by_pass[k])
    if args.exit_distill > 0 and loops >= 2:
        lp1 = F.log_softmax(by_pass[1].float().view(-1, logits.shape[-1]), -1)
        with torch.no_grad():
            lp2 = F.log_softmax(by_pass[2].float().view(-1, logits.shape[-1]), -1)
            conf1 = lp1.detach().max(-1).values.exp()
        kl = (lp2.exp() * (lp2 - lp1)).sum(-1)
        easy = getattr(args, "exit_distill_easy", 0.0)
        if easy > 0:
            # Only the batch's easiest tokens (the share with the smallest pass-1 / pass-2 KL):
            # those are the ones an exit gate would let out, so pass 1 is taught to be exact
            # there and the hard tokens keep what the second pass adds.
            with torch.no_grad():
                cut = torch.quantile(kl.detach().float(), min(1.0, easy))
            loss = loss + args.exit_distill * (kl * (kl.detach() <= cut)).mean()
        else:
            loss = loss + args.exit_distill * (conf1 * kl).mean()
    hold = getattr(args, "hold", 0.0)
    if hold > 0 and model.moves:
        # --hold: what the passes past the second move the state, penalised (a contraction:
        # four passes should keep what two or three reach, not drift past it).
        loss = loss + hold * torch.stack(model.moves).sum()
    if args.exit_calibrate > 0 and loops >= 2:
        lg1 = by_pass[1].float().view(-1, logits.shape[-1])
        with torch.no_grad():
            differs = (lg1.argmax(-1) != by_pass[2].view(-1, logits.shape[-1]).argmax(-1)).float()
        top1 = F.softmax(lg1, -1).max(-1).values
        loss = loss + args.exit_calibrate * (differs * top1).mean()
    return loss


LOOP_STAGES = {
    # (share of training where the stage starts, {loops: weight}); one count per step for the
    # whole batch. Few steps at one loop: the one-pass path stays usable (early exit) but the
    # weights are shaped for the deeper passes, so each pass adds to the last.
    "deep": [(0.0, {1: 1, 2: 2}), (0.15, {1: 1, 2: 3, 3: 2}), (0.4, {1: 1, 2: 3, 3: 2, 4: 3})],
    # The first built-in model's draw (1 in 6 steps at one loop once all counts are in).
    "even": [(0.0, {1: 1, 2: 1}), (0.25, {1: 1, 2: 2, 3: 1}), (0.5, {1: 1, 2: 2, 3: 1, 4: 2})],
    # Weighted toward the deepest count once it is in (1 step in 12 at one loop).
    "late": [(0.0, {1: 1, 2: 2}), (0.2, {1: 1, 2: 3, 3: 3}), (0.45, {1: 1, 2: 3, 3: 3, 4: 5})],
    # One step in 25 at one loop: the single pass is kept in reach, not tuned.
    "rare1": [(0.0, {1: 1, 2: 6}), (0.2, {1: 1, 2: 8, 3: 6}), (0.45, {1: 1, 2: 8, 3: 6, 4: 10})],
    # Never one loop (the bracket's other end: what the single pass is worth untrained).
    "no1": [(0.0, {2: 1}), (0.2, {2: 4, 3: 3}), (0.45, {2: 4, 3: 3, 4: 5})],
    # As no1, with more of the last stage at four loops (so four passes are not worse than two).
    "deep2": [(0.0, {2: 1}), (0.2, {2: 4, 3: 3}), (0.45, {2: 3, 3: 3, 4: 6})],
    # Past four: the last stage draws 2-6 passes with four the likeliest, so four sits inside
    # the trained range instead of at its edge (the iteration has to stay good past it).
    "deep4": [(0.0, {2: 1}), (0.15, {2: 3, 3: 3, 4: 2}), (0.4, {2: 2, 3: 2, 4: 3, 5: 2, 6: 1})],
    # Wider still (2-8 passes at the end), meant with --bptt 4: the passes before the last four
    # run without gradients, so a deep step costs little more than a four-pass one and the
    # iteration learns to keep improving (or hold) past the counts users ask for.
    "wide": [(0.0, {2: 1}), (0.15, {2: 3, 3: 3, 4: 2}), (0.4, {2: 2, 3: 2, 4: 3, 5: 2, 6: 2, 8: 1})],
    # Past two: as deep4, but the last stage draws two passes once in ten steps, so the weights
    # are shaped for three to six (four passes the likeliest) and two is kept in reach.
    "past2": [(0.0, {2: 1}), (0.15, {2: 2, 3: 3, 4: 2}), (0.4, {2: 1, 3: 2, 4: 3, 5: 2, 6: 2})],
    # A bracket, not a recipe: one pass and four only, four three times in four steps (does
    # training at four passes alone move four past two, with two left to interpolate?).
    "ends": [(0.0, {1: 1, 4: 3})],
}


def loop_choices_at(step, steps, schedule="deep"):
    """The loop-count curriculum: 1-2 passes first, then 1-3, then 1-4 (LOOP_STAGES), a count
    drawn per step as Dory's training draws it; returns (counts, weights)."""
    f = step / max(1, steps)
    stage = [w for start, w in LOOP_STAGES[schedule] if f >= start][-1]
    return list(stage.keys()), list(stage.values())


def main():
    ap = argparse.ArgumentParser(description="Train the built-in Dory model on one GPU.")
    ap.add_argument("--data", required=True, help="folder of prepare_data.py's output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=16, help="rows of --ctx tokens per step")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--passkey-share", type=float, default=0.25)
    ap.add_argument("--task-share", type=float, default=0.3,
                    help="share of each batch's rows packed with task-suite items (tasks.py)")
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--loop-schedule", default="deep2", choices=sorted(LOOP_STAGES))
    ap.add_argument("--compile", type=int, default=1, help="torch.compile the layer blocks (1) or not (0)")
    ap.add_argument("--task-eval", type=int, default=120, help="held-out task items asked at the end")
    ap.add_argument("--minutes", type=float, default=6.4,
                    help="stop training (and export) after this long even if steps remain")
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--eval-rows", type=int, default=24, help="held-out rows of 1,024 tokens per evaluation")
    ap.add_argument("--ratio-weight", type=float, default=2.0,
                    help="weight of the 2-over-1 loop gain (nats) when the kept checkpoint is chosen")
    ap.add_argument("--deep-weight", type=float, default=1.0,
                    help="weight in the kept checkpoint's score of 4 loops' held-out loss above 2 loops'")
    ap.add_argument("--task-suite", type=int, default=2,
                    help="tasks.py's suite of the held-out task items (1: the shipped model's)")
    ap.add_argument("--init", default="", help="start from this folder's model.safetensors "
                    "(an earlier run's OUT/dory-mini) instead of random weights")
    ap.add_argument("--aux1", type=float, default=0.0,
                    help="weight of the loss of the read-out after one pass, added on steps of "
                    "two or more passes (early-exit training; 0: off)")
    ap.add_argument("--aux1-from", type=float, default=0.0,
                    help="share of training done (0-1) from which --aux1 applies (0: from the "
                    "start; the one-pass loss from the start takes the second pass's gain away)")
    ap.add_argument("--aux-at", default="",
                    help="deep supervision: PASS:WEIGHT,... read-outs after these pass counts, "
                    "each trained with the step's loss at WEIGHT on steps of more passes "
                    "(e.g. 2:0.3,4:0.3: what four passes say stays as good as two)")
    ap.add_argument("--exit-distill", type=float, default=0.0,
                    help="weight of a loss pulling the one-pass read-out toward the two-pass "
                    "one (KL, the two-pass side fixed) on each token in proportion to the one-pass "
                    "top probability: a confident first pass must be the second's answer, which "
                    "is what the conf gate lets out on (0: off)")
    ap.add_argument("--exit-distill-easy", type=float, default=0.0,
                    help="with --exit-distill: pull only the share (0-1) of each batch's tokens "
                    "whose one-pass read-out is already closest to the two-pass one (smallest KL), "
                    "unweighted, instead of every token by its top probability (0: off)")
    ap.add_argument("--hold", type=float, default=0.0,
                    help="weight of a penalty on how far each pass past the second moves the state "
                    "(mean 1 - cos of the state before and after it): four passes keep what two or "
                    "three reach instead of drifting past it (0: off)")
    ap.add_argument("--exit-calibrate", type=float, default=0.0,
                    help="weight of a loss on the one-pass read-out's top probability where its "
                    "choice differs from the two-pass one's: the first pass learns to be unsure "
                    "where the second would change its answer, not the second's answer (which "
                    "--exit-distill teaches, taking the loop gain with it) (0: off)")
    ap.add_argument("--bptt", type=int, default=0,
                    help="backpropagate through the last N loop passes only (0: all)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    t_start = time.time()
    aux_at = {int(k): float(w) for k, w in (x.split(":") for x in args.aux_at.split(",") if x)}

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True

    train_docs = read_docs(os.path.join(args.data, "train.jsonl.gz"))
    val_docs = read_docs(os.path.join(args.data, "val.jsonl.gz"))
    log(f"{len(train_docs)} train / {len(val_docs)} val documents")
    model_dir = os.path.join(args.out, "dory-mini")
    tok = train_tokenizer(train_docs, args.vocab, model_dir)
    log(f"tokenizer: {tok.get_vocab_size()} ids")
    train_stream = encode_stream(tok, [d["text"] for d in train_docs] + chat_docs(train_docs, rng), rng)
    val_stream = encode_stream(tok, [d["text"] for d in val_docs], random.Random(7))
    log(f"tokens: train {len(train_stream):,}, val {len(val_stream):,}")
    pk_train = PassKeys(tok, train_stream, rng, 3000, 300, args.ctx - 8)
    pk_val = PassKeys(tok, val_stream, random.Random(11), 1, 300, 1000)
    import tasks as TS
    TS.SUITE = args.task_suite
    task_val = TS.items(args.task_eval, 2)
    held = frozenset(x["q"] for x in task_val)
    tpath = os.path.join(args.data, "tasks_train.jsonl.gz")
    if os.path.exists(tpath):
        with gzip.open(tpath, "rt") as f:
            task_train = [json.loads(line) for line in f]
    else:
        task_train = TS.items(100000, 1, held)
    task_rows = TaskRows(tok, task_train)
    log(f"task suite: {len(task_train)} train items, {len(task_val)} held out")
    log(f"pass-key templates ready ({time.time() - t_start:.0f} s)")

    stream_gpu = torch.as_tensor(train_stream, device=DEV)
    model = Dory(CONFIG).to(DEV)
    g = torch.Generator(device=DEV)
    g.manual_seed(args.seed)
    model.init_weights(generator=g)
    if args.init:
        # Go on from an earlier run's exported weights (bf16; same config and tokenizer).
        load_weights(model, args.init, f"--init {args.init}")
        log(f"weights from {args.init}")
    model.p_drop = args.dropout
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters")
    if args.compile:
        import torch._dynamo as dynamo
        dynamo.config.suppress_errors = True  # a graph that fails to compile runs eager
        model.seq_compiled = torch.compile(model._run_seq)

    mats = [p for p in model.parameters() if p.dim() == 2]
    vecs = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.1},
                             {"params": vecs, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    def progress(step):
        """Share of training done: of --steps, or of the time left for training under
        --minutes, whichever is further (so the schedules end when the time does)."""
        budget = args.minutes * 60 - (t_train - t_start)
        return max(step / max(1, args.steps), (time.time() - t_train) / max(1.0, budget))

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = progress(step)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    T, B = args.ctx, args.batch
    val_rows = [val_stream[i:i + 1025] for i in range(0, len(val_stream) - 1025, 1025)][:48]
    history, best, result_best = [], (float("inf"), None), None
    t_train = time.time()
    step = 0
    for step in range(args.steps):
        if progress(step) >= 1.0:
            log(f"time budget reached at step {step}")
            break
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        starts = torch.randint(0, len(train_stream) - T - 1, (B,), device=DEV)
        rows = stream_gpu[starts[:, None] + torch.arange(T + 1, device=DEV)[None]]
        weights = torch.ones(B, T, device=DEV)
        n_pk = int(round(B * args.passkey_share))
        for b in range(n_pk):
            ids, ans = pk_train.sample(rng)
            ids = torch.as_tensor(ids, device=DEV)
            L = min(len(ids), T)
            rows[b, 1:L + 1] = ids[:L]
            rows[b, 0] = EOT
            if L + 1 <= T:
                rows[b, L + 1] = EOT
            weights[b, ans:ans + 6] = 8.0  # the answer: the part only retrieval predicts
        n_task = int(round(B * args.task_share))
        for b in range(n_pk, min(B, n_pk + n_task)):
            ids, ans = task_rows.row(rng, T)
            rows[b] = torch.as_tensor(ids, device=DEV)
            weights[b] = 1.0
            if ans:
                # weights[b, j] weighs the prediction of rows[b, j + 1]
                weights[b, torch.as_tensor([p - 1 for p in ans], device=DEV)] = 4.0
        counts, cw = loop_choices_at(progress(step), 1, args.loop_schedule)
        loops = rng.choices(counts, cw)[0]
        if step == 0 and model.seq_compiled is not None:
            with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
                model.eval()
                model(rows[:1, :-1], 1)  # fills the sliding-window mask cache eagerly
                model.train()
        loss = step_loss(model, rows, weights, loops, args, aux_at, progress(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            el = time.time() - t_train
            log(f"step {step} loops {loops} loss {loss.item():.4f} gnorm {gn.item():.2f} "
                f"lr {lr_at(step):.2e} {(step + 1) * B * T / max(el, 1e-9) / 1e3:.0f}k tok/s")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            ev = val_rows[:args.eval_rows]
            vl = eval_loss(model, ev, 2)
            vl1 = eval_loss(model, ev, 1)
            vl4 = eval_loss(model, ev, 4)
            pk = eval_passkey(model, pk_val, random.Random(step), 1024, 10, 2)
            # Keep the checkpoint that best trades held-out loss for retrieval (a pass
            # key found is worth 0.5 nats of loss) and for what the loops add: the gain of
            # 2 loops over 1 counts --ratio-weight times, 4 loops worse than 2 is a cost.
            score = vl - 0.5 * pk + args.ratio_weight * (vl - vl1) + args.deep_weight * max(0.0, vl4 - vl)
            history.append({"step": step + 1, "train_loss": loss.item(), "val_loss": vl,
                            "val_loss_loops1": vl1, "val_loss_loops4": vl4, "passkey_1024": pk,
                            "score": score})
            mem = torch.cuda.max_memory_allocated() / 2**30 if DEV == "cuda" else 0.0
            log(f"eval step {step + 1} ({mem:.1f} GiB peak): val loss {vl:.4f} (ppl {math.exp(vl):.2f}, loops 1 "
                f"{math.exp(vl1):.2f}, 4 {math.exp(vl4):.2f}, ratio {math.exp(vl - vl1):.3f}) "
                f"pass key {pk:.2f} score {score:.4f}")
            if score < best[0]:
                best = (score, {k: v.detach().clone() for k, v in model.state_dict().items()})
                result_best = step + 1
    train_s = time.time() - t_train
    log(f"trained {step + 1} steps in {train_s:.0f} s")
    if best[1] is not None:
        model.load_state_dict(best[1])
    sd = export(model, model_dir)
    # Evaluate what was exported: bf16 weights.
    model.load_state_dict({k: v.float() for k, v in sd.items()})
    result = {"steps": step + 1, "train_seconds": train_s, "params": n_params,
              "history": history, "kept_step": result_best, "tokens_train": int(len(train_stream)),
              "tokens_val": int(len(val_stream))}
    for lp in (1, 2, 3, 4):
        vl = eval_loss(model, val_rows, lp)
        result[f"val_ppl_loops{lp}"] = math.exp(vl)
        log(f"val ppl loops={lp}: {math.exp(vl):.2f}")
    for lp in (1, 2, 4):
        acc = eval_tasks(model, tok, task_val, lp)
        result[f"tasks_loops{lp}"] = acc
        log(f"task accuracy loops={lp}: " + ", ".join(f"{k} {v:.2f}" for k, v in acc.items()))
    for length in (1024, 2048, 4000):
        acc = eval_passkey(model, pk_val, random.Random(length), length, 20, 2)
        result[f"passkey_{length}"] = acc
        log(f"pass key at {length} tokens: {acc:.2f}")
    result["self_check"] = self_check(sd, model_dir, val_stream)
    reference_logits(sd, model, val_stream, os.path.join(args.out, "dory-mini-ref.npz"))
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(result, f, indent=2)
    log(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
