#!/usr/bin/python3
"""`dory run` and `dory chat` end to end, as a person sees them.

A small random-weight checkpoint is made with the vocabulary of a real trained
tokenizer (tests/data/tokenizers/), and the tokenizer files are put beside the
weights: a Hugging Face directory as people download it. The text is noise (the
weights are random), so the tests check what must hold whatever the weights:
streaming to stdout, statistics on stderr, determinism, seeds, limits, stop
strings, chat turns reusing the KV cache, /reset, Ctrl-C through a pty.
"""

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKDIR = os.path.join(ROOT, "tests", "data", "tokenizers")
DORY = os.environ.get("DORY_BIN", "")
sys.dont_write_bytecode = True

_TMP = tempfile.mkdtemp(prefix="dory_e2e_")
MODEL = os.path.join(_TMP, "model")


def pick_tokenizer():
    """The first test tokenizer with a chat template and an end-of-text token."""
    for name in sorted(os.listdir(TOKDIR)):
        cfg = os.path.join(TOKDIR, name, "tokenizer_config.json")
        if os.path.exists(cfg):
            with open(cfg, encoding="utf-8") as f:
                if json.load(f).get("chat_template"):
                    return os.path.join(TOKDIR, name)
    raise RuntimeError("no tokenizer with a chat template under " + TOKDIR)


def setUpModule():
    if not DORY or not os.access(DORY, os.X_OK):
        raise RuntimeError("DORY_BIN must name the dory binary")
    tok = pick_tokenizer()
    with open(os.path.join(tok, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    n = max(list(vocab["model"]["vocab"].values()) + [t["id"] for t in vocab.get("added_tokens", [])]) + 1
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", MODEL,
                    "--set", "vocab_size=%d" % n, "--set", "max_position_embeddings=4096", "--quiet"], check=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), MODEL)


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def dory(*args, stdin=None, timeout=60):
    return subprocess.run([DORY, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


STATS = re.compile(r"prompt: (\d+) tokens in [\d.]+ s \([\d.]+ t/s\) \| generation: (\d+) tokens in [\d.]+ s "
                   r"\([\d.]+ t/s\) \| stop: (\w+)")


class Run(unittest.TestCase):
    def test_streams_text_and_reports_speed(self):
        r = dory("run", "-m", MODEL, "-p", "The king said", "-n", "12", "--temp", "0", "-t", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip(), "no text on stdout")
        m = STATS.search(r.stderr)
        self.assertIsNotNone(m, r.stderr)
        self.assertGreater(int(m.group(1)), 0)
        # Random weights rarely pick end-of-text; either way the count is bounded by -n.
        self.assertLessEqual(int(m.group(2)), 12)
        self.assertIn(m.group(3), ("length", "eos"))
        # stderr carries only the statistics; stdout only the text.
        self.assertNotIn("prompt:", r.stdout)

    def test_greedy_is_deterministic_and_seeds_reproduce(self):
        a = dory("run", "-m", MODEL, "-p", "Once upon a time", "-n", "10", "--temp", "0")
        b = dory("run", "-m", MODEL, "-p", "Once upon a time", "-n", "10", "--temp", "0")
        self.assertEqual(a.stdout, b.stdout)
        s1 = dory("run", "-m", MODEL, "-p", "Once", "-n", "16", "-s", "7", "--temp", "1.5", "--top-k", "0")
        s2 = dory("run", "-m", MODEL, "-p", "Once", "-n", "16", "-s", "7", "--temp", "1.5", "--top-k", "0")
        s3 = dory("run", "-m", MODEL, "-p", "Once", "-n", "16", "-s", "8", "--temp", "1.5", "--top-k", "0")
        self.assertEqual(s1.stdout, s2.stdout)
        self.assertNotEqual(s1.stdout, s3.stdout)

    def test_prompt_from_file_equals_prompt_flag(self):
        path = os.path.join(_TMP, "prompt.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("In the beginning")
        a = dory("run", "-m", MODEL, "-f", path, "-n", "8", "--temp", "0")
        b = dory("run", "-m", MODEL, "-p", "In the beginning", "-n", "8", "--temp", "0")
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)

    def test_stop_string_cuts_the_output(self):
        full = dory("run", "-m", MODEL, "-p", "Hello", "-n", "24", "--temp", "0", "--ignore-eos").stdout.rstrip("\n")
        self.assertGreater(len(full), 6)
        stop = full[3:6]  # a piece the greedy text is known to contain
        cut = dory("run", "-m", MODEL, "-p", "Hello", "-n", "24", "--temp", "0", "--ignore-eos", "--stop", stop)
        self.assertEqual(cut.returncode, 0, cut.stderr)
        self.assertEqual(cut.stdout.rstrip("\n"), full[:full.find(stop)])
        self.assertIn("stop: stop", cut.stderr)

    def test_bad_requests_fail_cleanly(self):
        for args in (["-p", ""], ["-f", os.path.join(_TMP, "missing.txt")], ["-p", "x", "--temp", "-1"],
                     ["-p", "x", "--top-p", "2"]):
            r = dory("run", "-m", MODEL, *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertGreater(r.returncode, 0, args)  # no signal
            self.assertTrue(r.stderr.strip(), args)


class Chat(unittest.TestCase):
    def test_turns_reuse_the_cache_and_reset_starts_over(self):
        r = dory("chat", "-m", MODEL, "--temp", "0", "-n", "6", "--verbose", "--system", "Be brief.",
                 stdin="Hello there\nWhat is your name?\nTell me more\n/reset\nHello there\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        turns = [tuple(map(int, m)) for m in
                 re.findall(r"\[turn \d+: prompt (\d+) tokens, (\d+) reused from the cache, (\d+) new fed", r.stderr)]
        self.assertEqual(len(turns), 4, r.stderr)
        (p1, r1, n1), (p2, r2, n2), (p3, r3, n3), (p4, r4, n4) = turns
        self.assertEqual(r1, 0)
        self.assertEqual(n1, p1)
        # Turns 2 and 3 feed only what is new: the cache holds the earlier turns.
        for p, reused, new in ((p2, r2, n2), (p3, r3, n3)):
            self.assertGreater(reused, 0)
            self.assertEqual(reused + new, p)
            self.assertLess(new, p)
        self.assertGreater(r3, r2)
        # After /reset the first message costs the same as at the start.
        self.assertEqual((p4, r4, n4), (p1, 0, p1))
        self.assertIn("[chat reset]", r.stderr)
        answers = [l for l in r.stdout.split("\n") if l.strip()]
        self.assertGreaterEqual(len(answers), 1)

    def test_ctrl_c_stops_the_answer_and_keeps_the_chat(self):
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(DORY, [DORY, "chat", "-m", MODEL, "--temp", "0", "-n", "-1", "--ignore-eos", "-t", "1",
                            "--verbose"])
        out = b""

        def read_until(pattern, timeout=30):
            nonlocal out
            end = time.time() + timeout
            while time.time() < end:
                r, _, _ = select.select([fd], [], [], 0.2)
                if r:
                    try:
                        out += os.read(fd, 4096)
                    except OSError:
                        break
                if re.search(pattern, out):
                    return True
            return False

        try:
            self.assertTrue(read_until(rb"> "), out)
            os.write(fd, b"Say something long\r")
            self.assertTrue(read_until(rb"\[turn 1: prompt"), out)
            time.sleep(1.0)  # let it write for a while
            os.write(fd, b"\x03")  # Ctrl-C, through the terminal driver
            self.assertTrue(read_until(rb"\[stopped\]"), out)
            self.assertTrue(read_until(rb"> $|> \Z", 10) or b"> " in out.split(b"[stopped]")[-1], out)
            os.write(fd, b"And now?\r")
            # The chat goes on. (How much of the cache turn 2 reuses is checked above: after
            # a long answer of random-weight noise, re-tokenized U+FFFD can end the common
            # prefix further back than the sliding window's rewind margin, and the session
            # then starts over, which is the right thing to do.)
            self.assertTrue(read_until(rb"\[turn 2: prompt \d+ tokens"), out)
            os.write(fd, b"\x03")
            self.assertTrue(read_until(rb"\[stopped\][\s\S]*\[stopped\]"), out)
            os.write(fd, b"\x04")  # Ctrl-D at the prompt ends the chat
            _, status = os.waitpid(pid, 0)
            self.assertTrue(os.WIFEXITED(status), "chat did not exit normally: %r" % status)
            self.assertEqual(os.WEXITSTATUS(status), 0)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(fd)


if __name__ == "__main__":
    unittest.main()
