#!/usr/bin/python3
"""dory pull / -hf against a Hub stand-in on loopback (hub_standin.py): first download into
the Hugging Face cache layout, a cache hit that requests no weights, resume after a dropped
connection and after an interrupted run, a bad checksum (clear error, nothing left in the
snapshot), offline mode, an unreachable Hub with a cache, a gated repository (401 without
HF_TOKEN), no matching quant (the error lists what exists), a safetensors repository, and the
logits of a -hf model equal to those of the same file given with -m. No internet is used.

    DORY_BIN=build/dory /usr/bin/python3 tests/hub/test_pull.py -v
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import hub_standin  # noqa: E402

DORY = os.environ.get("DORY_BIN", os.path.join(ROOT, "build", "dory"))
IDS = "1,5,9,13,17,21"


class Pull(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dory_hub_")
        ck = os.path.join(cls.tmp, "ck")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", ck, "--preset",
                        "tiny", "--quiet"], check=True)
        files = {}
        for t in ("q8_0", "q4_0"):
            p = os.path.join(cls.tmp, "tiny-%s.gguf" % t.upper())
            subprocess.run([DORY, "quantize", ck, p, "--type", t, "-q"], check=True, capture_output=True)
            files[t] = open(p, "rb").read()
        cls.q8, cls.q40 = files["q8_0"], files["q4_0"]
        cls.q8_path = os.path.join(cls.tmp, "tiny-Q8_0.gguf")
        cls.ck = ck
        st = {n: open(os.path.join(ck, n), "rb").read() for n in sorted(os.listdir(ck))}
        # The corrupted repository's file is its own (blobs are shared by hash across repos).
        cls.other = b"GGUF" + np.random.default_rng(3).integers(0, 256, 4000, dtype=np.uint8).tobytes()
        bad = bytearray(cls.other)
        bad[len(bad) // 2] ^= 0xFF
        cls.hub = hub_standin.Hub({
            "org/tiny-GGUF": {"files": {"tiny-Q8_0.gguf": cls.q8, "tiny-Q4_0.gguf": cls.q40,
                                        "README.md": b"# tiny\n"}},
            "org/tiny": {"files": dict(st, **{"README.md": b"# tiny safetensors\n"})},
            "org/gated-GGUF": {"files": {"g-Q8_0.gguf": cls.q8}, "gated": "secret", "cdn": True},
            "org/bad-GGUF": {"files": {"b-Q8_0.gguf": cls.other}, "lie": {"b-Q8_0.gguf": bytes(bad)}},
        })

    @classmethod
    def tearDownClass(cls):
        cls.hub.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.home = tempfile.mkdtemp(dir=self.tmp)
        del self.hub.log[:]

    def env(self, **kw):
        e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        e.update(HF_HOME=self.home, HF_ENDPOINT=self.hub.url, DORY_BF16_INPUT="float")
        e.update(kw)
        return e

    def dory(self, *args, **env):
        return subprocess.run([DORY, *args], capture_output=True, text=True, env=self.env(**env))

    def pull(self, spec, **env):
        return self.dory("pull", spec, **env)

    def repo_dir(self, repo):
        return os.path.join(self.home, "hub", "models--" + repo.replace("/", "--"))

    def logits(self, *args, **env):
        out = os.path.join(self.home, "l.npy")
        r = self.dory("logits", *args, "--ids", IDS, "-o", out, **env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(out)

    def one_line_error(self, r, text):
        # One line of error (a progress line for what was downloaded may come before it).
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        errors = [s for s in r.stderr.splitlines() if s.startswith("error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        self.assertIn(text, errors[0])
        self.assertEqual(r.stderr.strip().splitlines()[-1], errors[0])

    def test_first_download_then_cache_hit(self):
        r = self.pull("org/tiny-GGUF:Q8_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        path = r.stdout.strip()
        d = self.repo_dir("org/tiny-GGUF")
        sha = hashlib.sha256(self.q8).hexdigest()
        self.assertEqual(path, os.path.join(d, "snapshots", hub_standin.COMMIT, "tiny-Q8_0.gguf"))
        self.assertTrue(os.path.islink(path))
        self.assertEqual(os.readlink(path), "../../blobs/" + sha)
        self.assertEqual(open(path, "rb").read(), self.q8)
        self.assertEqual(open(os.path.join(d, "refs", "main")).read(), hub_standin.COMMIT)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "blobs"))), [sha])  # only the file asked for
        self.assertIn("1 downloaded", r.stderr)
        # A second pull: the API is asked, the weights are not.
        del self.hub.log[:]
        r = self.pull("org/tiny-GGUF:q8_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), path)
        self.assertEqual(self.hub.requests("/blobs/") + self.hub.requests("/org/"), [])
        self.assertIn("0 downloaded", r.stderr)
        # -hf runs the cached file: the same logits as -m on the file itself.
        np.testing.assert_array_equal(self.logits("-hf", "org/tiny-GGUF:Q8_0"), self.logits("-m", self.q8_path))

    def test_a_cache_written_by_huggingface_hub_is_used(self):
        # huggingface_hub's layout, written here by hand as huggingface-cli would have left it:
        # blobs named by the LFS SHA-256, a relative link in snapshots/COMMIT, refs/main.
        d = self.repo_dir("org/tiny-GGUF")
        sha = hashlib.sha256(self.q40).hexdigest()
        os.makedirs(os.path.join(d, "blobs"))
        os.makedirs(os.path.join(d, "snapshots", hub_standin.COMMIT))
        os.makedirs(os.path.join(d, "refs"))
        with open(os.path.join(d, "blobs", sha), "wb") as f:
            f.write(self.q40)
        os.symlink("../../blobs/" + sha, os.path.join(d, "snapshots", hub_standin.COMMIT, "tiny-Q4_0.gguf"))
        with open(os.path.join(d, "refs", "main"), "w") as f:
            f.write(hub_standin.COMMIT)
        r = self.pull("org/tiny-GGUF:Q4_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("0 downloaded", r.stderr)
        self.assertEqual(self.hub.requests("/blobs/") + self.hub.requests("/org/"), [])

    def test_resume_after_dropped_connection_and_after_interruption(self):
        self.hub.drop_file_once(self.q40)
        r = self.pull("org/tiny-GGUF:Q4_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(open(r.stdout.strip(), "rb").read(), self.q40)
        blob_reqs = self.hub.requests("/blobs/")
        self.assertEqual(len(blob_reqs), 2, blob_reqs)
        self.assertIsNone(blob_reqs[0][2])
        self.assertTrue(blob_reqs[1][2] and blob_reqs[1][2].startswith("bytes="), blob_reqs)
        # An earlier run that stopped partway left blobs/HASH.incomplete: the next one resumes it.
        self.home = tempfile.mkdtemp(dir=self.tmp)
        blobs = os.path.join(self.repo_dir("org/tiny-GGUF"), "blobs")
        os.makedirs(blobs)
        sha = hashlib.sha256(self.q8).hexdigest()
        with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
            f.write(self.q8[:1000])
        del self.hub.log[:]
        r = self.pull("org/tiny-GGUF:Q8_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(open(r.stdout.strip(), "rb").read(), self.q8)
        self.assertEqual([x[2] for x in self.hub.requests("/blobs/")], ["bytes=1000-"])
        self.assertFalse(os.path.exists(os.path.join(blobs, sha + ".incomplete")))

    def test_bad_checksum_leaves_nothing(self):
        r = self.pull("org/bad-GGUF:Q8_0")
        self.one_line_error(r, "SHA-256")
        d = self.repo_dir("org/bad-GGUF")
        self.assertEqual(os.listdir(os.path.join(d, "blobs")), [])
        self.assertFalse(os.path.exists(os.path.join(d, "snapshots", hub_standin.COMMIT, "b-Q8_0.gguf")))

    def test_offline_and_unreachable(self):
        r = self.pull("org/tiny-GGUF:Q8_0", HF_HUB_OFFLINE="1")
        self.one_line_error(r, "not in the cache")
        self.assertEqual(self.hub.log, [])
        self.assertEqual(self.pull("org/tiny-GGUF:Q8_0").returncode, 0)
        del self.hub.log[:]
        r = self.pull("org/tiny-GGUF:Q8_0", HF_HUB_OFFLINE="1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.hub.log, [])
        self.assertEqual(open(r.stdout.strip(), "rb").read(), self.q8)
        # A Hub that does not answer: the cached snapshot, said so.
        r = self.pull("org/tiny-GGUF:Q8_0", HF_ENDPOINT="http://127.0.0.1:1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("unreachable", r.stderr)

    def test_gated_repository(self):
        r = self.pull("org/gated-GGUF:Q8_0")
        self.one_line_error(r, "HF_TOKEN")
        r = self.pull("org/gated-GGUF:Q8_0", HF_TOKEN="wrong")
        self.one_line_error(r, "no access")
        del self.hub.log[:]
        r = self.pull("org/gated-GGUF:Q8_0", HF_TOKEN="secret")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(open(r.stdout.strip(), "rb").read(), self.q8)
        # The token goes to the Hub, not to the other host its download redirects to.
        self.assertEqual([x[3] for x in self.hub.requests("/api/")], ["Bearer secret"])
        self.assertEqual([x[3] for x in self.hub.requests("/org/")], ["Bearer secret"])
        self.assertEqual([x[3] for x in self.hub.requests("/blobs/")], [None])

    def test_no_matching_quant_lists_what_exists(self):
        r = self.pull("org/tiny-GGUF:Q6_K")
        self.one_line_error(r, "Q8_0, Q4_0")
        r = self.pull("org/tiny-GGUF")  # two quants, no Q4_K_M: say which exist
        self.one_line_error(r, "Q4_K_M")
        for bad, msg in (("org/nope-GGUF:Q8_0", "not found"), ("not a repo", "not a Hub model name"),
                         ("org/tiny:Q8_0", "has no GGUF files")):
            self.one_line_error(self.pull(bad), msg)

    def test_safetensors_repository(self):
        r = self.pull("org/tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        snap = r.stdout.strip()
        self.assertEqual(snap, os.path.join(self.repo_dir("org/tiny"), "snapshots", hub_standin.COMMIT))
        self.assertEqual(sorted(os.listdir(snap)), sorted(os.listdir(self.ck)))  # no README
        np.testing.assert_array_equal(self.logits("-hf", "org/tiny"), self.logits("-m", self.ck))
        self.one_line_error(self.dory("logits", "-m", self.ck, "-hf", "org/tiny", "--ids", "1", "-o", "x.npy"), "not both")


if __name__ == "__main__":
    unittest.main()
