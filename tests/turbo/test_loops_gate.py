#!/usr/bin/python3
"""Loops on demand, prompt loops and early exit (docs/model.md sections 3 and 4) against the
float64 numpy reference, on the tiny random checkpoint of the parity tests.

    DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/turbo -v

Every case compares the engine with the reference run on the very schedule the engine
reports (--passes-out): under last_loop a token that ran fewer passes leaves its
last pass's rows in the recurrent caches, so a wrong or missing row changes every
later logit.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "parity"))
sys.dont_write_bytecode = True
import test_parity as P  # noqa: E402  (checkpoint maker, engine runner, tolerances)
from test_parity import dory_ref  # noqa: E402


def top_prob(row):
    d = row - row.max()
    return 1.0 / np.exp(d[d > -20]).sum()


class Turbo(P.EngineCase):
    def logits(self, model, ids, *flags, prompt_rows=0):
        """(logits of the scored rows, passes per position, stderr) from `dory logits`."""
        binary = os.environ.get("DORY_BIN")
        if not binary or not os.access(binary, os.X_OK):
            self.fail("DORY_BIN is not set or not executable (%r)" % binary)
        fd, out = tempfile.mkstemp(suffix=".npy", dir=P._TMP)
        os.close(fd)
        passes = out + ".passes"
        cmd = [binary, "logits", "-m", model, "--ids", ",".join(map(str, ids)), "-t", str(P.THREADS),
               "-o", out, "--passes-out", passes, "--prompt-rows", str(prompt_rows)] + list(flags)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        if r.returncode != 0:
            self.fail("engine failed (rc %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr.decode()[-2000:]))
        got = np.load(out)
        with open(passes) as f:
            p = [int(v) for v in f.read().strip().split(",")]
        os.remove(out)
        os.remove(passes)
        self.assertEqual(len(p), len(ids))
        return got, p, r.stderr.decode()

    def reference(self, model, ids, chunks, loops_per_chunk, scored_from):
        ref = dory_ref.run(model, ids, kv="last_loop", chunks=chunks, loops_per_chunk=loops_per_chunk)
        return ref[scored_from:]


class PromptLoops(Turbo):
    def test_prompt_chunks_run_fewer_passes(self):
        m = P.checkpoint()
        ids = P.token_ids(m, n=30)
        # 20 prompt rows in chunks of 8, 8, 4 at one pass each, then 10 decode rows at 3.
        got, passes, _ = self.logits(m, ids, "--kv", "last_loop", "--loops", "3", "--prompt-loops", "1",
                                     "--chunk", "8", prompt_rows=20)
        self.assertEqual(passes, [1] * 20 + [3] * 10)
        # The engine feeds the 10 scored rows in chunks of 8 and 2.
        chunks, lpc = [8, 8, 4, 8, 2], [1, 1, 1, 3, 3]
        ref = self.reference(m, ids, chunks, lpc, 20)
        self.assertParity(got, ref, "prompt loops 1 of 3, last_loop")
        full = self.reference(m, ids, chunks, [3] * 5, 20)
        self.assertDiffer(full, ref, "reference with all passes vs prompt loops")

    def test_prompt_loops_need_last_loop(self):
        m = P.checkpoint()
        r = self.run_engine_raw(m, P.token_ids(m), ["--kv", "per_loop", "--prompt-loops", "1"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("--prompt-loops needs --kv last_loop", r.stderr.decode())


class Gate(Turbo):
    def test_conf_gate_exits_on_sure_tokens_and_matches_the_reference(self):
        m = P.checkpoint()
        ids = P.token_ids(m, n=40)
        prompt = 8
        # A threshold that splits this random model's decode tokens between one and two passes.
        theta = None
        for th in (0.02, 0.03, 0.05, 0.08, 0.12, 0.2):
            got, passes, err = self.logits(m, ids, "--kv", "last_loop", "--chunk", "1",
                                           "--gate", "conf:%g" % th, prompt_rows=prompt)
            scored = passes[prompt:]
            if 8 <= scored.count(1) <= len(scored) - 8:
                theta = th
                break
        self.assertIsNotNone(theta, "no threshold split the tokens (passes %s)" % passes)
        print("  conf:%g: %d of %d tokens left after one pass" % (theta, scored.count(1), len(scored)))
        chunks = [1] * len(ids)
        ref = self.reference(m, ids, chunks, passes, prompt)
        self.assertParity(got, ref, "conf gate schedule, last_loop decode")
        # Each decision follows the rule: a token left after one pass when its first
        # read-out was sure, and took the second when it was not (while the tracker read out).
        self.assertIn("read-outs %d" % len(scored), err)  # the exit rate never fell below 0.35
        for i in range(prompt, len(ids)):
            one = self.reference(m, ids[:i + 1], chunks[:i + 1], passes[:i] + [1], i)[-1]
            p1 = top_prob(one)
            if passes[i] == 1:
                self.assertGreaterEqual(p1, theta - 1e-4, "token %d left with top prob %.4f" % (i, p1))
                self.assertLess(P.maxdiff(got[i - prompt], one), P.TOL)
            else:
                self.assertLess(p1, theta + 1e-4, "token %d took two passes with top prob %.4f" % (i, p1))
        # Two passes for everyone is a different schedule: the gate really changed the numbers.
        self.assertDiffer(self.reference(m, ids, chunks, [2] * len(ids), prompt), ref, "gate vs no gate")

    def test_tracker_skips_read_outs_and_probes(self):
        m = P.checkpoint()
        ids = P.token_ids(m, n=42)
        # Nothing is ever sure at theta 1: after 10 misses the exit rate is 0.9^10 < 0.35, so
        # read-outs stop but for one probe in 8 tokens: 10 + 3 over 40 decode tokens.
        _, passes, err = self.logits(m, ids, "--kv", "last_loop", "--chunk", "1", "--gate", "conf:1",
                                     prompt_rows=2)
        self.assertEqual(passes[2:], [2] * 40)
        g = re.search(r"(\d+) tokens gated, ([\d.]+)% left after one pass \(read-outs (\d+), probes (\d+)\)", err)
        self.assertIsNotNone(g, err)
        self.assertEqual((int(g.group(1)), int(g.group(3)), int(g.group(4))), (40, 13, 3))

    def test_gates_refuse_per_loop_and_a_missing_router(self):
        m = P.checkpoint()
        ids = P.token_ids(m)
        r = self.run_engine_raw(m, ids, ["--gate", "conf:0.5"])  # the checkpoint is per_loop
        self.assertEqual(r.returncode, 1)
        self.assertIn("needs --kv last_loop", r.stderr.decode())
        r = self.run_engine_raw(m, ids, ["--kv", "last_loop", "--gate", "recon"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("no router", r.stderr.decode())
        for bad in ("conf:0", "conf:1.5", "conf:x", "fast", "recon:nan"):
            r = self.run_engine_raw(m, ids, ["--kv", "last_loop", "--gate", bad])
            self.assertEqual(r.returncode, 1, bad)
            self.assertIn("--gate", r.stderr.decode(), bad)
            self.assertEqual(len(r.stderr.decode().strip().splitlines()), 1, bad)


if __name__ == "__main__":
    unittest.main()
