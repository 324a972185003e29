#!/usr/bin/env python3
"""Builds the training corpus for the test tokenizers from public text that Debian ships.

Run on a Debian 12 machine that has these packages (none of them is needed to build or test
dory.cpp; only to remake tests/data/tokenizers):

    apt-get install bible-kjv bible-kjv-text fortunes fortunes-zh fortunes-de fortunes-ru \
        fortunes-es fortunes-it fortunes-pl fortunes-bg fortunes-cs fortunes-br \
        hunspell-ar hunspell-he

Sources: the King James Bible (through the `bible` program), every fortune file (English,
Chinese, German, Russian, ...), Python's standard library sources, C headers under
/usr/include, the licenses under /usr/share/common-licenses, and the Arabic and Hebrew
hunspell word lists (for right-to-left scripts). Text that is not UTF-8 is dropped line by
line. Output: OUT/*.txt.gz, one file per source, about 40 MB of text before compression.

    python3 scripts/tokenizers/prepare_corpus.py --out .tokcorpus
"""
import argparse
import glob
import gzip
import os
import random
import subprocess
import sys


def clean_lines(raw: bytes):
    for line in raw.split(b"\n"):
        try:
            s = line.decode("utf-8")
        except UnicodeDecodeError:
            continue
        # Terminal escapes and other C0 controls (fortune art) are noise; keep tabs.
        s = "".join(ch for ch in s if ch == "\t" or ch >= " " or ch == "\r").rstrip("\r")
        yield s


def write(out_dir, name, lines):
    path = os.path.join(out_dir, name + ".txt.gz")
    n = 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as f:
        for s in lines:
            f.write(s + "\n")
            n += len(s.encode()) + 1
    print(f"{path}: {n / 1e6:.2f} MB", file=sys.stderr)
    return n


def read_files(paths, limit_bytes=None):
    total = 0
    for p in paths:
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, "rb") as f:
            raw = f.read()
        for s in clean_lines(raw):
            yield s
            total += len(s) + 1
        if limit_bytes and total > limit_bytes:
            return


def bible_lines():
    # The bible program prints "  N verse text" wrapped at 80 columns; unwrap verses.
    out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, check=True,
                         env=dict(os.environ, COLUMNS="100000")).stdout
    for s in clean_lines(out):
        s = s.strip()
        if s:
            yield s


def fortune_lines():
    files = []
    for root, _, names in os.walk("/usr/share/games/fortunes"):
        for n in sorted(names):
            if not n.endswith((".dat", ".u8")):
                files.append(os.path.join(root, n))
    for s in read_files(sorted(files)):
        if s != "%":
            yield s


def dic_lines(paths):
    # hunspell .dic: a count line, then word/FLAGS per line. Group words into lines of ~12.
    words = []
    for p in paths:
        with open(p, "rb") as f:
            for s in clean_lines(f.read()):
                w = s.split("/")[0].strip()
                if w and not w.isdigit():
                    words.append(w)
    rng = random.Random(7)
    rng.shuffle(words)
    for i in range(0, len(words), 12):
        yield " ".join(words[i:i + 12])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    total = 0
    total += write(args.out, "bible", bible_lines())
    total += write(args.out, "fortunes", fortune_lines())
    py = sorted(glob.glob("/usr/lib/python3.11/**/*.py", recursive=True))
    total += write(args.out, "python", read_files(py))
    hdr = sorted(glob.glob("/usr/include/**/*.h", recursive=True))
    total += write(args.out, "c_headers", read_files(hdr, limit_bytes=6_000_000))
    total += write(args.out, "licenses", read_files(sorted(glob.glob("/usr/share/common-licenses/*"))))
    total += write(args.out, "arabic", dic_lines(["/usr/share/hunspell/ar.dic"]))
    total += write(args.out, "hebrew", dic_lines(["/usr/share/hunspell/he_IL.dic"]))
    print(f"total {total / 1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
