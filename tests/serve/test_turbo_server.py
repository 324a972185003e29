#!/usr/bin/python3
"""`dory serve` on a turbo file (dory calibrate on the built-in model: last_loop, the recon
gate, the far field o1 32,128,4,512 and 256 exact rows) takes the same generation path as
`dory run`: the exact rows are chosen at the prompt's end, memory stays constant once the
far fields have sealed, and a pass key planted early in a long prompt comes back through the
server as through `dory run`. `dory logits` and `dory ppl` choose exact rows too.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
from serverlib import ROOT, Server, metrics, post_json  # noqa: E402

DORY = os.environ.get("DORY_BIN", "")
_TMP = tempfile.mkdtemp(prefix="dory_serve_turbo_")
TURBO = os.path.join(_TMP, "mini-turbo.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"  # Debian's base-files: on every machine

INTRO = ("There is an important piece of information hidden inside a lot of "
         "irrelevant text. Find it and memorize it.\n")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"


def passkey_prompt(key, n_lines, at=3):
    """The training examples' pass-key prompt (scripts/train/passkey_eval.py) with the key
    after `at` lines of filler and n_lines lines in all (~20 tokens a line)."""
    with open(TEXT, encoding="utf-8") as f:
        lines = [s.strip() for s in f if s.strip()][:n_lines]
    return (INTRO + "".join(s + "\n" for s in lines[:at]) + NEEDLE.format(key=key) +
            "".join(s + "\n" for s in lines[at:]) + QUESTION)


def setUpModule():
    if not DORY or not os.access(DORY, os.X_OK):
        raise RuntimeError("DORY_BIN must name the dory binary")
    subprocess.run([DORY, "calibrate", "-m", os.path.join(ROOT, "models", "dory-mini"), "-f", TEXT,
                    "-o", TURBO, "-t", "2"], check=True, capture_output=True)


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def run_cli(*args):
    r = subprocess.run([DORY, *args], capture_output=True, text=True)
    if r.returncode:
        raise AssertionError("dory %s: %s" % (" ".join(args[:1]), r.stderr))
    return r


class TurboServer(unittest.TestCase):
    def test_kv_bytes_stay_constant_after_the_seal(self):
        srv = Server(DORY, TURBO, "--parallel", "1", "-t", "2", "-c", "4096")
        try:
            kv, used = [], []
            for n_lines in (60, 120, 180):  # ~1,200, ~2,300, ~3,400 tokens: all past the seal at 512
                status, body = post_json(srv.port, "/v1/completions", {
                    "prompt": passkey_prompt("12345", n_lines), "max_tokens": 1, "temperature": 0})
                self.assertEqual(status, 200, body)
                used.append(body["usage"]["prompt_tokens"])
                kv.append(metrics(srv.port)["dory_kv_cache_bytes"])
            self.assertGreater(used[0], 1000)
            self.assertGreater(used[2], 3000)
            # Windows, sinks, the chosen exact rows and the far fields' state: all constant
            # in context length (before the fix the server kept every far row: 8.7, 12.2,
            # 19.3 MB at 900, 1,800 and 3,600 tokens).
            self.assertEqual(kv[0], kv[1], "KV bytes %s after prompts of %s tokens" % (kv, used))
            self.assertEqual(kv[1], kv[2], "KV bytes %s after prompts of %s tokens" % (kv, used))
            # The same as dory run reports for such a prompt.
            r = run_cli("run", "-m", TURBO, "-p", passkey_prompt("12345", 120), "-n", "1", "--temp", "0",
                        "-t", "2", "-v")
            line = [s for s in r.stderr.splitlines() if s.startswith("kv cache:")][0]
            exact, far = (float(x.split()[0]) for x in line[len("kv cache:"):].split("+"))
            self.assertIn("MiB exact", line)
            self.assertAlmostEqual(kv[1] / 2**20, exact + far, delta=0.02, msg=line)
        finally:
            srv.stop()

    def test_pass_key_comes_back_through_the_server_as_through_run(self):
        srv = Server(DORY, TURBO, "--parallel", "2", "-t", "2")
        try:
            for key in ("71432", "50918", "23867"):
                prompt = passkey_prompt(key, 60)
                r = run_cli("run", "-m", TURBO, "-p", prompt, "-n", "7", "--temp", "0", "-t", "2")
                status, body = post_json(srv.port, "/v1/completions",
                                         {"prompt": prompt, "max_tokens": 7, "temperature": 0})
                self.assertEqual(status, 200, body)
                served = body["choices"][0]["text"]
                self.assertEqual(served, r.stdout.rstrip("\n"), key)
                self.assertIn(key, served)
        finally:
            srv.stop()

    def test_a_key_in_the_last_512_rows_is_kept_too(self):
        """Exact rows are chosen in two stages (docs/model.md section 6): a key planted 40
        lines (~800 tokens) into a 60-line prompt sits in the last 512 rows, out of the
        128-row window by the end; the final stage keeps it. Before the two stages (one
        choice 512 rows before the end) such keys were lost (pass-key table, docs/turbo.md)."""
        for key in ("71432", "50918", "23867"):
            prompt = passkey_prompt(key, 60, at=40)
            r = run_cli("run", "-m", TURBO, "-p", prompt, "-n", "7", "--temp", "0", "-t", "2")
            self.assertIn(key, r.stdout, key)

    def test_logits_and_ppl_choose_exact_rows(self):
        # Exact rows change what the far field holds only once they are chosen, at the
        # prompt's end; a tool that never says where the prompt ends gets the logits of
        # --exact off (as dory logits and dory ppl did before they said it).
        prompt = passkey_prompt("71432", 60)
        ids = run_cli("tokenize", "-m", TURBO, "-p", prompt, "--special").stdout.strip()
        self.assertTrue(ids.startswith("[") and ids.endswith("]"), ids[:40])
        out = os.path.join(_TMP, "l.npy")
        tops = {}
        for exact in ("256", "off"):
            r = run_cli("logits", "-m", TURBO, "--ids", ids[1:-1].replace(" ", ""), "-o", out, "--exact", exact,
                        "-t", "2")
            with open(out, "rb") as f:
                tops[exact] = f.read()
        self.assertTrue(tops["256"] != tops["off"], "dory logits: --exact 256 gave the logits of --exact off")
        r = run_cli("ppl", "-m", TURBO, "-f", TEXT, "--ctx", "1536", "--chunks", "1", "-t", "2", "--exact", "off")
        r2 = run_cli("ppl", "-m", TURBO, "-f", TEXT, "--ctx", "1536", "--chunks", "1", "-t", "2")
        self.assertTrue(r.stdout != r2.stdout, "dory ppl: exact rows changed nothing: %s" % r.stdout[-200:])


if __name__ == "__main__":
    unittest.main()
