#!/usr/bin/python3
"""Unicode normalizers (NFC, NFD, NFKC, NFKD, Lowercase) in tokenizer.json.

Oracle: Python's unicodedata (and str.lower on text whose lowercase is one code point
per code point): encoding s with a normalizer X must equal encoding X(s) with no
normalizer, through `dory tokenize --jsonl`.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unicodedata
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2 = os.path.join(ROOT, "tests", "data", "tokenizers", "gpt2", "tokenizer.json")

STRINGS = [
    "cafe\u0301 na\u00efve e\u0301le\u0300ve",  # combining accents
    "\u00c5ngstr\u00f6m \u212b \u1e9b\u0323",  # A-ring, Angstrom sign, long s with dots
    "\uff21\uff22\uff23 \u2460\u2461 \ufb01ne \u00bd",  # fullwidth, circled digits, fi ligature
    "\ud55c\uad6d\uc5b4 \u1100\u1161\u11a8",  # Hangul syllables and jamo
    "Good WORLD \u00c9COLE \u0391\u0392\u0393 \u0414\u041e\u041c",  # for lowercase
    "plain ascii text 123",
]


def dory_ids(tokenizer_json, strings):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
        path = f.name
    try:
        r = subprocess.run([os.environ["DORY_BIN"], "tokenize", "-m", tokenizer_json, "--jsonl", path],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return [json.loads(l) for l in r.stdout.splitlines()]


class Normalizers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(os.environ.get("DORY_BIN", ""), os.X_OK):
            raise AssertionError("DORY_BIN must name the dory binary")
        cls.tmp = tempfile.mkdtemp(prefix="dory_norm_")
        with open(GPT2, encoding="utf-8") as f:
            cls.base = json.load(f)
        assert cls.base.get("normalizer") is None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def with_normalizer(self, norm):
        j = dict(self.base)
        j["normalizer"] = norm
        path = os.path.join(self.tmp, "%s.json" % norm["type"])
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        return path

    def test_unicode_forms(self):
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            got = dory_ids(self.with_normalizer({"type": form}), STRINGS)
            want = dory_ids(GPT2, [unicodedata.normalize(form, s) for s in STRINGS])
            self.assertEqual(got, want, form)
            # and the normalizer really changed something
            self.assertNotEqual(got, dory_ids(GPT2, STRINGS), form)

    def test_lowercase(self):
        got = dory_ids(self.with_normalizer({"type": "Lowercase"}), STRINGS)
        self.assertEqual(got, dory_ids(GPT2, [s.lower() for s in STRINGS]))

    def test_sequence_nfkc_then_lowercase(self):
        path = self.with_normalizer({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})
        got = dory_ids(path, STRINGS)
        self.assertEqual(got, dory_ids(GPT2, [unicodedata.normalize("NFKC", s).lower() for s in STRINGS]))


if __name__ == "__main__":
    unittest.main()
