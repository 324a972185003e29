#!/usr/bin/python3
"""CMF files written by an independent writer (cmf_writer.py, from docs/cmf.md) read back by
dory: decoded tensors equal numpy's decoding of the same bytes, dory verify passes a good
file and names the tensor of a flipped byte, and damaged files get one-line errors.
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import cmf_writer as W  # noqa: E402

DORY = os.environ.get("DORY_BIN", "")


def dory(*args):
    return subprocess.run([DORY, *args], capture_output=True, text=True)


class Cmf(unittest.TestCase):
    def setUp(self):
        if not DORY or not os.access(DORY, os.X_OK):
            self.fail("DORY_BIN must name the dory binary")
        self.tmp = tempfile.mkdtemp(prefix="dory_cmf_")
        self.path = os.path.join(self.tmp, "m.cmf")
        rng = np.random.default_rng(3)
        self.w = rng.standard_normal((16, 96)).astype(np.float32)
        self.tensors = [("a.q8_2f", W.Q8_2F, (16, 96), W.enc_q8_2f(self.w)),
                        ("b.q4_block", W.Q4_BLOCK, (16, 96), W.enc_q4_block(self.w)),
                        ("c.f32", W.F32, (96,), self.w[0].tobytes()),
                        ("d.bf16", W.BF16, (3,), np.array([1.0, -2.5, 0.125], np.float32).view(np.uint32)
                         .__rshift__(16).astype(np.uint16).tobytes())]
        W.write(self.path, self.tensors, vocab=b'{"model":{}}')

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dump(self, name):
        out = os.path.join(self.tmp, name + ".npy")
        r = dory("info", "-m", self.path, "--dump", name, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(out)

    def test_decoded_tensors_equal_numpys(self):
        q82 = self.dump("a.q8_2f")
        self.assertTrue(np.array_equal(q82, W.dec_q8_2f(self.tensors[0][3], 16, 96)))
        self.assertLess(np.abs(q82 - self.w).max(), 0.1)  # and close to what was encoded
        q4 = self.dump("b.q4_block")
        self.assertTrue(np.array_equal(q4.ravel(), W.dec_q4_block(self.tensors[1][3], 16 * 96)))
        self.assertTrue(np.array_equal(self.dump("c.f32"), self.w[0]))
        self.assertTrue(np.array_equal(self.dump("d.bf16"), np.array([1.0, -2.5, 0.125], np.float32)))

    def test_verify(self):
        r = dory("verify", self.path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("6 hashes checked, 0 mismatched", r.stdout)
        data = bytearray(open(self.path, "rb").read())
        data[4096 + 5] ^= 0x40  # a byte of a.q8_2f
        bad = os.path.join(self.tmp, "bad.cmf")
        open(bad, "wb").write(bytes(data))
        r = dory("verify", bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn("a.q8_2f", r.stdout)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_info_lists_sections_dtypes_skills(self):
        W.write(self.path, self.tensors, extra_header={"skills": [{"id": "sql", "name": "SQL", "layers": [2, 3],
                                                                    "selection": {"metric": "mse"}}]})
        r = dory("info", "-m", self.path)
        self.assertEqual(r.returncode, 0, r.stderr)
        for s in ("CMF v2", "q8_2f", "q4_block", "skill          sql (SQL), layers [2,3], routable"):
            self.assertIn(s, r.stdout)

    def test_damaged_files_are_one_line_errors(self):
        good = open(self.path, "rb").read()
        for what, at, val in (("magic", 0, b"X"), ("version", 4, b"\x07"), ("feature bit 4", 12, b"\x11"),
                              ("header offset", 0x10, b"\xff\xff\xff\x7f"), ("dtype", None, None)):
            data = bytearray(good)
            if at is None:  # the first record's dtype byte
                doff = int.from_bytes(good[0x20:0x28], "little")
                data[doff + 16 + 6] = 99
            else:
                data[at:at + len(val)] = val
            p = os.path.join(self.tmp, "x.cmf")
            open(p, "wb").write(bytes(data))
            for cmd in (("verify", p), ("info", "-m", p)):
                r = dory(*cmd)
                self.assertEqual(r.returncode, 1, (what, cmd))
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, (what, r.stderr))
                self.assertIn("not a valid CMF file", r.stderr, what)
        p = os.path.join(self.tmp, "short.cmf")
        open(p, "wb").write(good[:100])
        self.assertIn("less than the 128-byte envelope", dory("verify", p).stderr)
        r = dory("verify", os.path.join(self.tmp, "m.gguf"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("checks CMF files", r.stderr)


if __name__ == "__main__":
    unittest.main()
