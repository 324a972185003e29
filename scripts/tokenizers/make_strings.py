#!/usr/bin/env python3
"""Writes the test strings the golden files are made from: one JSON string per line.

Fixed seed, so the same corpus gives the same strings. Categories: English prose, code,
numbers, whitespace runs (tabs, newlines, CR LF, trailing spaces, Unicode spaces), CJK,
emoji and ZWJ sequences, combining marks, Arabic and Hebrew (right to left), very long
words, special-token spellings embedded in text, apostrophe contractions, and random
assigned Unicode code points. Code points are drawn from what Python's unicodedata calls
assigned (Python 3.11: Unicode 14.0, the version PCRE2 10.42 and Oniguruma 6.9.8 use), so
the goldens do not depend on which regex library knows about newer characters.

    python3 scripts/tokenizers/make_strings.py --corpus .tokcorpus --out .tokcorpus/strings.jsonl
"""
import argparse
import gzip
import json
import os
import random
import unicodedata

# Every added token of every test tokenizer, and near misses, to embed in text.
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<mask>", "[WORD]", "<sep>", "Hello",
    "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<|begin_of_text|>", "<|eot_id|>",
    "<SPECIAL_17>", "<SPECIAL_999>", "<SPECIAL_5>", "<0x41>", "<0x0A>", "<pad>",
]
NEAR_MISSES = ["<|im_sta", "<s", "</s >", "<<s>>", "<|endoftext|", "[WORD", "<mask >",
               "<SPECIAL_1000>", "<|IM_START|>", "< s>", "<0x4G>", "<0xZZ>"]

SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u00a0",
          "\u3000", "\u2028", "\u2029", "\u180e", "\u200b", "\x0b", "\x0c", "\x85", "\u2003",
          "\u202f", "\ufeff", " \t \n"]

EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👍🏿", "❤️", "🔥", "🎉", "🚀", "🇯🇵", "🇺🇸", "🇩🇪",
         "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🏴‍☠️", "1️⃣", "#️⃣", "🧑🏾‍🚀", "👁️‍🗨️", "🤦‍♂️", "✅",
         "☕", "🐍", "🦀", "🧪", "🫠", "🪐", "™", "©️", "↔️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]

ARABIC = "مرحبا بالعالم هذا نص عربي للاختبار مع أرقام ١٢٣٤ و 5678 في الجملة".split()
HEBREW = "שלום עולם זהו טקסט בעברית לבדיקה עם מספרים 1234 וגם ניקוד: שָׁלוֹם".split()
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u036f", "\u0489", "\u20dd",
             "\u093f", "\u094d", "\u0e31", "\u0e49", "\u05b8", "\u0651", "\u1ab0", "\ufe0f"]


def assigned_pool(rng, n):
    pool = []
    while len(pool) < n:
        r = rng.random()
        if r < 0.6:
            cp = rng.randrange(0x20, 0x3000)
        elif r < 0.85:
            cp = rng.randrange(0x3000, 0x10000)
        else:
            cp = rng.randrange(0x10000, 0x30000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata.category(chr(cp))
        if cat in ("Cn", "Cs"):
            continue
        pool.append(chr(cp))
    return pool


def read_lines(corpus, name, rng, n, min_len=1):
    path = os.path.join(corpus, name + ".txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    while len(out) < n:
        i = rng.randrange(len(lines))
        k = rng.choice([1, 1, 1, 2, 3, 5, 8])
        s = "\n".join(lines[i:i + k])
        if len(s) >= min_len:
            out.append(s)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(20261202)
    S = []

    # English prose (bible, fortunes) and code (python, C headers).
    S += read_lines(args.corpus, "bible", rng, 250, 10)
    S += read_lines(args.corpus, "fortunes", rng, 300, 10)
    S += read_lines(args.corpus, "python", rng, 250, 5)
    S += read_lines(args.corpus, "c_headers", rng, 100, 5)
    S += read_lines(args.corpus, "licenses", rng, 50, 10)

    # Numbers.
    for _ in range(200):
        kind = rng.randrange(8)
        if kind == 0:
            s = str(rng.randrange(10 ** rng.randrange(1, 25)))
        elif kind == 1:
            s = f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 9)}f}"
        elif kind == 2:
            s = f"{rng.randrange(10**9):,}"
        elif kind == 3:
            s = f"{rng.random():e}"
        elif kind == 4:
            s = f"0x{rng.randrange(16**12):x} 0b{rng.randrange(2**20):b} 0o{rng.randrange(8**8):o}"
        elif kind == 5:
            s = f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d} {rng.randrange(24):02d}:{rng.randrange(60):02d}"
        elif kind == 6:
            s = "".join(rng.choice("0123456789") for _ in range(rng.randrange(20, 80)))
        else:
            s = f"Call +1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)} or pay ${rng.randrange(10**6) / 100:.2f}, ٣٤٥ ۱۲ १२३ ① ½ Ⅻ"
        S.append(s)

    # Whitespace runs, leading and trailing.
    words = ["hello", "world", "The", "x", "def", "foo()", "42", "über", "naïve", "'s"]
    for _ in range(250):
        parts = []
        for _ in range(rng.randrange(1, 8)):
            parts.append(rng.choice(SPACES) * rng.choice([1, 1, 2, 3, 7]))
            if rng.random() < 0.7:
                parts.append(rng.choice(words))
        S.append("".join(parts))
    S += ["", " ", "  ", "\n", "\t", "\r\n", " \n \n ", "a ", " a", "a  ", "a\n", "\n\na\n\n",
          "    indented", "trailing   ", "\t\ttabs\t\t", "x" + " " * 50 + "y"]

    # CJK.
    for _ in range(200):
        kind = rng.randrange(4)
        if kind == 0:
            s = "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(rng.randrange(1, 40)))
        elif kind == 1:
            s = "".join(chr(rng.choice([rng.randrange(0x3041, 0x3097), rng.randrange(0x30A1, 0x30FB),
                                        rng.randrange(0x4E00, 0x9FA6)])) for _ in range(rng.randrange(1, 30)))
            s += rng.choice(["。", "、", "！", "？", "「テスト」", ""])
        elif kind == 2:
            s = " ".join("".join(chr(rng.randrange(0xAC00, 0xD7A4)) for _ in range(rng.randrange(1, 5)))
                         for _ in range(rng.randrange(1, 8)))
        else:
            s = f"中文English混合{rng.randrange(1000)}テスト，標點符號：（括號）【方括號】 and ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３"
        S.append(s)

    # Emoji, ZWJ sequences, flags, keycaps, skin tones.
    for _ in range(200):
        parts = []
        for _ in range(rng.randrange(1, 8)):
            parts.append(rng.choice(EMOJI))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "abc", " text ", "\n", "!!"]))
        S.append("".join(parts))

    # Combining marks (decomposed letters, stacked marks, Indic and Thai clusters).
    for _ in range(150):
        s = []
        for _ in range(rng.randrange(1, 12)):
            s.append(rng.choice("aeiouAEIOUnzxक्षกไทย"))
            for _ in range(rng.choice([0, 1, 1, 2, 5])):
                s.append(rng.choice(COMBINING))
            if rng.random() < 0.2:
                s.append(" ")
        S.append("".join(s))
    S += ["e\u0301", "\u0301", "\u0301\u0301\u0301", "Ä" + "\u0308" * 20, "ǅ", "ﬁ", "Å", "Å"]

    # Right to left: Arabic and Hebrew, alone and mixed with Latin, digits and bidi marks.
    for _ in range(150):
        src = ARABIC if rng.random() < 0.5 else HEBREW
        ws = [rng.choice(src) for _ in range(rng.randrange(1, 10))]
        if rng.random() < 0.4:
            ws.insert(rng.randrange(len(ws) + 1), rng.choice(["GPU", "123", "(test)", "\u200f", "\u200e", "\u202b", "!", "…"]))
        S.append(" ".join(ws))
    S += read_lines(args.corpus, "arabic", rng, 40, 5)
    S += read_lines(args.corpus, "hebrew", rng, 40, 5)

    # Very long words and runs.
    for _ in range(60):
        kind = rng.randrange(8)
        n = rng.randrange(100, 3000)
        if kind == 0:
            s = rng.choice("abcxyz") * n
        elif kind == 1:
            s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
        elif kind == 2:
            s = "".join(rng.choice("0123456789") for _ in range(n))
        elif kind == 3:
            s = rng.choice("!?.-=*#") * n
        elif kind == 4:
            s = rng.choice([" ", "\n", "\t", " \n"]) * (n // 4)
        elif kind == 5:
            s = "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(n // 3))
        elif kind == 6:
            s = "https://example.com/" + "/".join("".join(rng.choice("abcdefghij0123456789-_") for _ in range(rng.randrange(3, 30))) for _ in range(n // 20)) + "?q=1&r=2#frag"
        else:
            s = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(n)) + "=="
        S.append(s)
    S.append("Pneumonoultramicroscopicsilicovolcanoconiosis " * 20)
    S.append("supercalifragilisticexpialidocious" * 30)

    # Special-token spellings embedded in text (both exact and near misses), next to spaces.
    base = read_lines(args.corpus, "fortunes", rng, 250, 5)
    for s in base:
        s = s[:200]
        for _ in range(rng.randrange(1, 5)):
            tok = rng.choice(SPECIALS if rng.random() < 0.8 else NEAR_MISSES)
            pad_l = rng.choice(["", "", " ", "  ", "\n", "x"])
            pad_r = rng.choice(["", "", " ", "  ", "\n", "y"])
            i = rng.randrange(len(s) + 1)
            s = s[:i] + pad_l + tok + pad_r + s[i:]
        S.append(s)
    S += ["<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
          "<s>[INST] What is 2+2? [/INST] 4</s>", "<s><s></s></s>", "<|endoftext|><|endoftext|>",
          "a[WORD]b", "a [WORD] b", "[WORD]", " [WORD]", "[WORD] ", "x[WORD]", "[WORD]y", "é[WORD]",
          "text <mask> more", "text<mask>more", "   <mask>", "<sep>", "  <sep>  x", "a<sep>b",
          "Hello", "Hello world", "Othello", "HelloHello", "Hello_", "_Hello", " Hello ",
          "<SPECIAL_17><SPECIAL_999>", "<SPECIAL_1000>", "<0x41><0x42>", "<unk>"]

    # Apostrophes and contractions (the (?i:'s|'t|...) branch), ASCII punctuation, edge cases.
    for w in ["it's", "IT'S", "don't", "DON'T", "we're", "WE'RE", "I've", "I'M", "you'll", "YOU'LL",
              "he'd", "HE'D", "'s", "'S", "'ll've", "rock'n'roll", "it’s", "'", "''", "'''s",
              "O'Neil's", "x's'", "'ſ", "'K"]:
        S.append(w)
        S.append("He said " + w + " twice, " + w + ".")
    S += ["!", "?!", "...", "—", "«»", "\"quoted\"", "a-b_c.d", "C++", "x+=1;", "#include <vector>",
          "@user", "e-mail@example.com", "$HOME", "100%", "~/.bashrc", "\\n", "\\\\"]
    S += ["\x00", "a\x00b", "\x01\x02\x03", "\x1b[31mred\x1b[0m", "\x7f", "\ufffd", "\ufffd\ufffd",
          "\U0010fffd", "\ue000", "\U000f0000"]

    # Random assigned code points.
    pool = assigned_pool(rng, 30000)
    for _ in range(300):
        n = rng.randrange(1, 40)
        s = "".join(rng.choice(pool) if rng.random() < 0.8 else rng.choice(" \n\tab1'.") for _ in range(n))
        S.append(s)

    # Mixed bag: pieces of every category glued together.
    for _ in range(150):
        a, b, c = rng.choice(S), rng.choice(S), rng.choice(S)
        S.append((a[:80] + rng.choice(SPACES) + b[:80] + c[:40]))

    with open(args.out, "w", encoding="utf-8") as f:
        for s in S:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"{len(S)} strings, {sum(len(s.encode()) for s in S) / 1e6:.2f} MB -> {args.out}")


if __name__ == "__main__":
    main()
