#!/usr/bin/python3
"""The built-in model (models/dory-mini, trained by scripts/train/train.py).

- Independent check: the engine's logits equal the training code's own float64 forward
  pass (scripts/train/dory_torch.py's cached schedule, dumped on the GPU machine into
  tests/data/dory-mini/ref.npz) for both KV modes, loops 1-4 and several chunk schedules.
- It is the default: `dory run` / `info` / `tokenize` without -m use it.
- `dory ppl` against a perplexity computed here from `dory logits`, window by window.
"""

import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "dory-mini")
REF = os.path.join(ROOT, "tests", "data", "dory-mini", "ref.npz")
DORY = os.environ.get("DORY_BIN", "")
sys.dont_write_bytecode = True

# Float32 engine against a float64 reference on the same bf16 weights: the differences
# seen are <= 6.4e-6 on logits up to |17|; the bound leaves room for other ISAs' rounding.
TOL = 1e-4


def dory(*args, env=None, timeout=120):
    return subprocess.run([DORY, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def setUpModule():
    if not DORY or not os.access(DORY, os.X_OK):
        raise RuntimeError("DORY_BIN must name the dory binary")


class TrainingCodeParity(unittest.TestCase):
    def test_every_case_matches(self):
        ref = np.load(REF)
        ids = ",".join(str(i) for i in ref["ids"])
        cases = [k for k in ref.files if k != "ids"]
        self.assertGreaterEqual(len(cases), 6)
        modes = set()
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "l.npy")
            for case in cases:
                m = re.fullmatch(r"(per_loop|last_loop)_loops(\d+)_chunk(\d+)", case)
                self.assertIsNotNone(m, case)
                mode, loops, chunk = m.group(1), m.group(2), m.group(3)
                modes.add(mode)
                r = dory("logits", "-m", MODEL, "--ids", ids, "--kv", mode, "--loops", loops,
                         "--chunk", chunk, "-o", out)
                self.assertEqual(r.returncode, 0, r.stderr)
                got, want = np.load(out), ref[case]
                self.assertEqual(got.shape, want.shape)
                d = float(np.abs(got.astype(np.float64) - want).max())
                self.assertLess(d, TOL, f"{case}: max |diff| {d}")
                self.assertTrue((got.argmax(1) == want.argmax(1)).all(), case)
        self.assertEqual(modes, {"per_loop", "last_loop"})

    def test_last_loop_schedule_matters_here(self):
        # The reference itself is not trivially mode-independent: last_loop with chunk 1
        # differs from per_loop, so the parity above checks two different computations.
        ref = np.load(REF)
        d = np.abs(ref["last_loop_loops2_chunk1"] - ref["per_loop_loops2_chunk24"]).max()
        self.assertGreater(d, 1e-3)


class Default(unittest.TestCase):
    def test_run_without_model_prints_english(self):
        r = dory("run", "-p", "The king said", "-n", "40", "--temp", "0", "-t", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        words = re.findall(r"[A-Za-z]+", r.stdout)
        self.assertGreaterEqual(len(words), 10, r.stdout)
        # Real words, not byte noise: most are made of letters only and are short.
        self.assertGreater(sum(len(w) <= 12 for w in words) / len(words), 0.9, r.stdout)
        common = {"the", "and", "of", "to", "a", "i", "is", "that", "he", "in", "unto", "it"}
        self.assertTrue(common & {w.lower() for w in words}, r.stdout)

    def test_info_and_tokenize_default(self):
        r = dory("info")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dory-mini", r.stdout)
        r = dory("tokenize", "-p", "In the beginning")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), r"^\[\d+(, ?\d+)*\]$")

    def test_dory_model_env_overrides(self):
        env = dict(os.environ, DORY_MODEL=os.path.join(ROOT, "no", "such", "model"))
        r = dory("info", env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no/such/model", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)


TEXT = ("And God said, Let there be light: and there was light. And God saw the light, "
        "that it was good: and God divided the light from the darkness. ") * 12


class Perplexity(unittest.TestCase):
    def test_matches_logits(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.txt")
            with open(path, "w") as f:
                f.write(TEXT)
            ctx = 64
            r = dory("ppl", "-f", path, "--ctx", str(ctx), "-t", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", r.stdout)
            self.assertIsNotNone(m, r.stdout)
            ppl = float(m.group(1))
            # The same windows by hand: token ids (BOS first), logits of each window.
            r = dory("tokenize", "-p", TEXT, "--special")
            ids = [int(x) for x in r.stdout.strip().strip("[]").split(",")]
            bos = ids[0]
            nll = []
            for w in range(len(ids) // ctx):
                win = ids[w * ctx:(w + 1) * ctx]
                win[0] = bos
                out = os.path.join(tmp, "l.npy")
                rr = dory("logits", "--ids", ",".join(map(str, win)), "-o", out)
                self.assertEqual(rr.returncode, 0, rr.stderr)
                lg = np.load(out).astype(np.float64)
                for j in range(ctx // 2, ctx - 1):
                    row = lg[j]
                    mx = row.max()
                    nll.append(math.log(np.exp(row - mx).sum()) + mx - row[win[j + 1]])
            want = math.exp(sum(nll) / len(nll))
            # Chunking differs (ppl feeds the first half without logits): per_loop is
            # chunk-independent, so only float rounding separates the two.
            self.assertAlmostEqual(ppl, want, delta=1e-3 * want)
            self.assertLess(ppl, 20.0)  # the model knows Genesis 1

    def test_loops_help_on_held_out_text(self):
        """The shipped model's loops pay off (issue 29): on a fixed held-out file of its own
        domain (tests/data/dory-mini/loops_heldout.txt, documents in turn from each source's
        held-out 3%), PPL at 2 loops <= 0.93 x PPL at 1 loop. At release: 45.06 / 40.52 /
        40.89 at loops 1 / 2 / 4 (ratio 0.899; 2026-12-07). Four loops are not yet better than two
        (+0.9%); the guard keeps them within 3% so a retraining cannot lose depth silently."""
        path = os.path.join(ROOT, "tests", "data", "dory-mini", "loops_heldout.txt")
        ppl = {}
        for loops in (1, 2, 4):
            r = dory("ppl", "-f", path, "--ctx", "512", "--loops", str(loops), "-t", "2",
                     timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            m = re.search(r"Final estimate: PPL = ([\d.]+)", r.stdout)
            self.assertIsNotNone(m, r.stdout)
            ppl[loops] = float(m.group(1))
        self.assertLessEqual(ppl[2], 0.93 * ppl[1], ppl)
        self.assertLessEqual(ppl[4], 1.03 * ppl[2], ppl)

    def test_loops_and_kv_flags(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.txt")
            with open(path, "w") as f:
                f.write(TEXT)
            for extra in (["--loops", "1"], ["--loops", "4", "--kv", "last_loop"]):
                r = dory("ppl", "-f", path, "--ctx", "64", *extra)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("Final estimate", r.stdout)
                self.assertIn("loops " + extra[1], r.stderr)

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as tmp:
            short = os.path.join(tmp, "short.txt")
            with open(short, "w") as f:
                f.write("Too short.")
            bad = os.path.join(tmp, "bad.txt")
            with open(bad, "wb") as f:
                f.write(b"ok \xff\xfe not utf-8 " * 40)
            for args, needle in ((["-f", short], "fewer than one window"),
                                 (["-f", bad], "not valid UTF-8"),
                                 (["-f", os.path.join(tmp, "missing.txt")], "missing.txt"),
                                 (["-f", short, "--ctx", "0"], "ctx")):
                r = dory("ppl", *args)
                self.assertGreater(r.returncode, 0, r.stderr)  # an error, not a signal
                self.assertIn(needle, r.stderr)
                self.assertLessEqual(r.stderr.count("\n"), 2, r.stderr)


if __name__ == "__main__":
    unittest.main()
