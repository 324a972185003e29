#!/usr/bin/python3
"""Share of dictionary words in what `dory run` writes with no -m (the built-in model).

    /usr/bin/python3 scripts/train/english_share.py [--dory build/dory] [-m MODEL] [--seeds 10] [-n 200]

Runs `dory run -p PROMPT -n N -s SEED` for a few prompts and seeds, splits the text into
words (letters and apostrophes), and counts a word as English when it, its lower-case form,
or the form without a possessive 's is in /usr/share/dict/words (Debian `wamerican`).
Prints the share per prompt and overall (goal of issue 29: >= 85%).
"""
import argparse
import re
import subprocess
import sys

PROMPTS = ["The king said", "Once upon a time", "The sea was", "It is a truth"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dory", default="build/dory")
    ap.add_argument("-m", "--model", default="", help="a model other than the built-in one")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--words", default="/usr/share/dict/words")
    a = ap.parse_args()
    try:
        with open(a.words, encoding="utf-8", errors="replace") as f:
            vocab = {w.strip() for w in f}
    except OSError as e:
        sys.exit(f"english_share: {e} (apt-get install wamerican)")
    vocab |= {w.lower() for w in vocab}
    total = ok = 0
    for p in PROMPTS:
        n = k = 0
        for seed in range(a.seeds):
            cmd = [a.dory, "run", "-p", p, "-n", str(a.n), "-s", str(seed), "-t", "2"]
            r = subprocess.run(cmd + (["-m", a.model] if a.model else []), capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"english_share: dory run failed: {r.stderr.strip()}")
            for w in re.findall(r"[A-Za-z']+", r.stdout):
                w = w.strip("'")
                if not w:
                    continue
                n += 1
                base = re.sub(r"'s$", "", w)
                k += w in vocab or w.lower() in vocab or base in vocab or base.lower() in vocab
        print(f"{p!r}: {k}/{n} words in the dictionary ({100 * k / max(1, n):.1f}%)")
        total += n
        ok += k
    print(f"all: {ok}/{total} = {100 * ok / max(1, total):.1f}%")


if __name__ == "__main__":
    main()
