#!/usr/bin/env python3
"""dory serve on a CMF model with a skill: a request's "skill" field runs it with that skill's
tensors (an engine of that skill's, made the first time a request names it), so its answer is
the answer of a server started with --skill of that id; "none" is the base weights; "auto"
routes the prompt with the file's routers (here to the one routable skill), as a server started
with --skill auto does for every request; an unknown id or a non-string is a 400 with one line."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import ROOT, Server, make_model, post_json, request  # noqa: E402

DORY = os.environ.get("DORY_BIN", os.path.join(ROOT, "build", "dory"))
PY = "/usr/bin/python3"


class SkillPerRequest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dory-skill-serve-")
        base = make_model(os.path.join(cls.tmp, "base"))
        # A same-shaped fine-tune: other random weights (every tensor differs, so the skill
        # replaces them all), the base's tokenizer beside it.
        ft = os.path.join(cls.tmp, "ft")
        with open(os.path.join(base, "config.json")) as f:
            cfg = json.load(f)
        subprocess.run([PY, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", ft, "--seed", "5",
                        "--set", "vocab_size=%d" % cfg["vocab_size"],
                        "--set", "max_position_embeddings=%d" % cfg["max_position_embeddings"], "--quiet"],
                       check=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(base, f), ft)

        def run(*a):
            r = subprocess.run([DORY, *a], capture_output=True, text=True)
            assert r.returncode == 0, (a, r.stderr)
        run("convert", base, os.path.join(cls.tmp, "base.cmf"), "--type", "bf16")
        run("convert", ft, os.path.join(cls.tmp, "ft.cmf"), "--type", "bf16")
        ids = os.path.join(cls.tmp, "p.ids")
        with open(ids, "w") as f:
            f.write("1,2,3,4,5,6,7,8\n9,10,11,12,13,14\n")
        cls.model = os.path.join(cls.tmp, "two.cmf")
        run("skill", "add", "-m", os.path.join(cls.tmp, "base.cmf"), "--from", os.path.join(cls.tmp, "ft.cmf"),
            "--id", "alt", "--prompt-ids", ids, "--rank", "2", "-o", cls.model)
        cls.plain = Server(DORY, cls.model, "-t", "2", "--parallel", "2")
        cls.alt = Server(DORY, cls.model, "-t", "2", "--parallel", "2", "--skill", "alt")
        cls.auto = Server(DORY, cls.model, "-t", "2", "--parallel", "2", "--skill", "auto")

    @classmethod
    def tearDownClass(cls):
        for s in (cls.plain, cls.alt, cls.auto):
            rc = s.stop()
            assert rc == 0, (rc, s.stderr())
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def stderr_with(srv, text, timeout=10):
        """The server's stderr once it holds `text` (a reader thread collects it, so a line
        printed before a response may arrive here just after it), or as it is at the timeout."""
        deadline = time.time() + timeout
        while text not in srv.stderr() and time.time() < deadline:
            time.sleep(0.02)
        return srv.stderr()

    def answer(self, srv, **extra):
        body = {"prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        body.update(extra)
        status, out = post_json(srv.port, "/v1/completions", body)
        self.assertEqual(status, 200, out)
        return out["choices"][0]["text"]

    def test_a_request_runs_the_skill_it_names(self):
        base = self.answer(self.plain)
        alt = self.answer(self.alt)
        self.assertNotEqual(base, alt)  # every tensor differs: the answers do
        self.assertEqual(self.answer(self.plain, skill="alt"), alt)
        self.assertEqual(self.answer(self.plain, skill="none"), base)
        self.assertEqual(self.answer(self.alt, skill="none"), base)
        self.assertEqual(self.answer(self.alt, skill="alt"), alt)
        self.assertEqual(self.answer(self.plain, skill="auto"), alt)
        self.assertIn("skill auto: 'alt'", self.stderr_with(self.plain, "skill auto: 'alt'"))
        self.assertIn("skill 'alt' loaded", self.stderr_with(self.plain, "skill 'alt' loaded"))
        # /health counts the slots of both engines once the second is there.
        status, _, data = request(self.plain.port, "GET", "/health")
        self.assertEqual(status, 200)
        self.assertIn(b'"slots_idle":4', data.replace(b" ", b""))

    def test_skill_auto_routes_every_request(self):
        """dory serve --skill auto: a request that names no skill is routed on its prompt, as
        "skill": "auto" is; one that names a skill runs that one."""
        alt = self.answer(self.alt)
        self.assertEqual(self.answer(self.auto), alt)
        self.assertIn("skill auto: 'alt'", self.stderr_with(self.auto, "skill auto: 'alt'"))
        self.assertEqual(self.answer(self.auto, skill="none"), self.answer(self.plain))

    def test_models_lists_the_skills(self):
        for srv, own in ((self.plain, "none"), (self.alt, "alt"), (self.auto, "auto")):
            status, _, data = request(srv.port, "GET", "/v1/models")
            self.assertEqual(status, 200)
            meta = json.loads(data)["data"][0]["meta"]
            self.assertEqual(meta["skills"], ["alt"])
            self.assertEqual(meta["skill"], own)

    def test_bad_skills_are_one_line_errors(self):
        for value, msg in (("nope", "has no skill 'nope' (it has: alt"), (7, "'skill' must be a string")):
            status, out = post_json(self.plain.port, "/v1/completions",
                                    {"prompt": [5, 6], "max_tokens": 2, "skill": value})
            self.assertEqual(status, 400, out)
            self.assertIn(msg, out["error"]["message"])
            self.assertNotIn("\n", out["error"]["message"])


if __name__ == "__main__":
    unittest.main()
