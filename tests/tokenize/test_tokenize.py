"""`dory tokenize` against the golden ids of tests/data/tokenizers (Hugging Face tokenizers
0.23.2), through --jsonl, plus its errors on bad input."""
import json
import os
import subprocess
import tempfile
import unittest

DORY = os.environ.get("DORY_BIN", "build/dory")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizers")
BASES = ["gpt2", "llama3-131k", "sp-bpe", "sp-metaspace"]


def run(*args, stdin=None):
    return subprocess.run([DORY, "tokenize", *args], input=stdin, capture_output=True, timeout=300)


def golden(name):
    with open(os.path.join(DATA, name, "golden.jsonl"), encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


class TokenizeCli(unittest.TestCase):
    def test_jsonl_matches_golden(self):
        for name in BASES:
            g = golden(name)
            lines = "".join(json.dumps(r["text"], ensure_ascii=False) + "\n" for r in g).encode()
            for special, key in ((False, "ids"), (True, "ids_special")):
                args = ["-m", os.path.join(DATA, name), "--jsonl", "-"] + (["--special"] if special else [])
                p = run(*args, stdin=lines)
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                out = p.stdout.decode().splitlines()
                self.assertEqual(len(out), len(g))
                bad = [r["text"] for r, o in zip(g, out) if json.loads(o) != r[key]]
                self.assertEqual(bad[:3], [], f"{name} {key}: {len(bad)} mismatches")

    def test_prompt_and_show(self):
        tj = os.path.join(DATA, "llama3-131k", "tokenizer.json")
        p = run("-m", tj, "-p", "Hello world")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        ids = json.loads(p.stdout.decode())
        p = run("-m", tj, "-p", "Hello world", "--special")
        self.assertEqual(json.loads(p.stdout.decode()), [1] + ids)  # "<s> $A"
        p = run("-m", tj, "-p", "Hello world", "--show")
        rows = p.stdout.decode().splitlines()
        self.assertEqual([int(r.split()[0]) for r in rows], ids)
        self.assertIn('" world"', rows[-1])
        # Special-token spellings: one id, or plain text with --no-parse-special.
        p = run("-m", tj, "-p", "<|im_start|>")
        self.assertEqual(json.loads(p.stdout.decode()), [5])
        p = run("-m", tj, "-p", "<|im_start|>", "--no-parse-special")
        self.assertGreater(len(json.loads(p.stdout.decode())), 1)

    def assert_error(self, p, needle):
        self.assertEqual(p.returncode, 1, p.stdout.decode())
        err = p.stderr.decode()
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn(needle, err)

    def test_errors(self):
        m = os.path.join(DATA, "gpt2")
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.jsonl")
            with open(bad, "wb") as f:
                f.write(b'"ok"\n"fine"\n{"not": "a string"}\n')
            self.assert_error(run("-m", m, "--jsonl", bad), "bad.jsonl:3: expected a JSON string")
            with open(bad, "wb") as f:
                f.write(b'"ok"\nnot json\n')
            self.assert_error(run("-m", m, "--jsonl", bad), "bad.jsonl:2: bad JSON")
            with open(bad, "wb") as f:
                f.write(b'"ok"\n"x\xff"\n')
            self.assert_error(run("-m", m, "--jsonl", bad), "bad.jsonl:2: not valid UTF-8 at byte 2")
            with open(bad, "wb") as f:
                f.write(b'"\\ud800"\n')
            self.assert_error(run("-m", m, "--jsonl", bad), "bad.jsonl:1: bad JSON")
            self.assert_error(run("-m", m, "--jsonl", os.path.join(d, "missing.jsonl")), "cannot open")
            broken = os.path.join(d, "tokenizer.json")
            with open(broken, "w") as f:
                f.write('{"model": {"type": "Unigram", "vocab": []}}')
            self.assert_error(run("-m", broken, "-p", "x"), "model Unigram is not supported")
            with open(broken, "w") as f:
                f.write('{"model": ')
            self.assert_error(run("-m", d, "-p", "x"), "invalid JSON")
        self.assert_error(run("-m", m, "-p", b"\xc3("), "not valid UTF-8")
        self.assert_error(run("-m", "/nonexistent/model", "-p", "x"), "no such file or directory")
        self.assert_error(run("-m", m), "exactly one of")


if __name__ == "__main__":
    unittest.main()
