#!/usr/bin/python3
"""Pass-key retrieval through the engine: a five-digit key planted at a random depth of
held-out text, asked for at the end; greedy decoding must give it back exactly.

    /usr/bin/python3 scripts/train/passkey_eval.py --dory build/dory [-m MODEL]
        [--data .traindata] [--lengths 1024,2048,4000] [--trials 20] [-- extra dory run flags]
    /usr/bin/python3 scripts/train/passkey_eval.py --write-prompt FILE --lengths N [--seed S]

The prompts follow the training examples of scripts/train/train.py (same intro, needle and
question); the filler is the held-out split (val.jsonl.gz) of prepare_data.py, so no
prompt was seen in training. Lengths are in tokens, counted with the model's tokenizer.
Prints one line per length: accuracy and the depths that failed.
"""
import argparse
import gzip
import json
import os
import random
import subprocess
import sys

INTRO = ("There is an important piece of information hidden inside a lot of "
         "irrelevant text. Find it and memorize it.\n")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"


def count_tokens(dory, model, texts):
    args = [dory, "tokenize", "--jsonl", "-"] + (["-m", model] if model else [])
    out = subprocess.run(args, input="\n".join(json.dumps(t) for t in texts) + "\n",
                         capture_output=True, text=True, check=True).stdout
    return [len(json.loads(line)) for line in out.splitlines()]


def build(lines, rng, dory, model, length):
    """Prompt text of about `length` tokens (+1 for BOS) with the key at a random depth."""
    key = "".join(rng.choice("0123456789") for _ in range(5))
    start = rng.randrange(len(lines))
    filler = []
    i = start
    # ~4 characters per token; then trim line by line to fit.
    while sum(len(s) + 1 for s in filler) < length * 5:
        filler.append(lines[i % len(lines)])
        i += 1
    depth = rng.random()
    fixed = count_tokens(dory, model, [INTRO + NEEDLE.format(key=key) + QUESTION])[0]
    # Binary search on the number of filler lines that fits.
    lo, hi = 1, len(filler)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = count_tokens(dory, model, ["\n".join(filler[:mid]) + "\n"])[0]
        if n + fixed <= length - 1:
            lo = mid
        else:
            hi = mid - 1
    f = filler[:lo]
    cut = int(len(f) * depth)
    text = (INTRO + "".join(s + "\n" for s in f[:cut]) + NEEDLE.format(key=key) +
            "".join(s + "\n" for s in f[cut:]) + QUESTION)
    return text, key, depth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dory", default="build/dory")
    ap.add_argument("-m", "--model", default="")
    ap.add_argument("--data", default=".traindata")
    ap.add_argument("--lengths", default="1024,2048,4000")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--write-prompt", metavar="FILE", default="",
                    help="write the first prompt (of the first length) to FILE, say its key, and stop")
    ap.add_argument("extra", nargs="*", help="more `dory run` flags (after --)")
    args = ap.parse_args()
    with gzip.open(os.path.join(args.data, "val.jsonl.gz"), "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    lines = [s for d in docs for s in d.split("\n") if s.strip()]
    for length in [int(x) for x in args.lengths.split(",")]:
        rng = random.Random(args.seed * 100003 + length)
        if args.write_prompt:
            text, key, depth = build(lines, rng, args.dory, args.model, length)
            with open(args.write_prompt, "w", encoding="utf-8") as f:
                f.write(text)
            n = count_tokens(args.dory, args.model, [text])[0]
            print(f"wrote {args.write_prompt}: {n} tokens, pass key {key} at depth {depth:.2f}")
            return
        ok, failed = 0, []
        for _ in range(args.trials):
            text, key, depth = build(lines, rng, args.dory, args.model, length)
            cmd = [args.dory, "run", "-p", text, "-n", "7", "--temp", "0"] + args.extra
            if args.model:
                cmd += ["-m", args.model]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(r.stderr.strip())
            got = "".join(ch for ch in r.stdout[:8] if ch.isdigit())[:5]
            if got == key:
                ok += 1
            else:
                failed.append(f"{depth:.2f}")
        print(f"pass key at {length} tokens: {ok}/{args.trials} = {ok / args.trials:.2f}"
              + (f" (failed at depths {', '.join(failed)})" if failed else ""), flush=True)


if __name__ == "__main__":
    main()
