#!/usr/bin/python3
"""--device on every model-running command: cpu runs, auto falls back to the CPU in a build
without a GPU backend, cuda there is a one-line error; dory info names the backends.

    DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/cli -v
"""
import os
import subprocess
import unittest

DORY = os.environ.get("DORY_BIN", "")
COMMANDS = [
    ["run", "-p", "The king said", "-n", "4"],
    ["chat", "-n", "4"],
    ["bench", "-p", "8", "-n", "4", "-r", "1"],
    ["ppl", "-f", "/usr/share/common-licenses/GPL-3", "-c", "64", "--chunks", "1"],
    ["logits", "--ids", "1,2,3", "-o", os.devnull],
    ["serve", "--port", "0"],
    ["calibrate", "-f", "/usr/share/common-licenses/GPL-3", "-o", os.devnull],
]


def dory(*args, stdin=""):
    return subprocess.run([DORY, *args], input=stdin, capture_output=True, text=True, timeout=120)


class Device(unittest.TestCase):
    def setUp(self):
        if not DORY or not os.access(DORY, os.X_OK):
            self.fail("DORY_BIN must name the dory binary")

    def info_backends(self):
        return [s for s in dory("info").stdout.splitlines() if s.startswith("backend ")]

    def test_info_names_the_backends(self):
        lines = self.info_backends()
        self.assertTrue(any(s.split()[1:3] == ["cpu:", "yes"] for s in lines), lines)
        self.assertTrue(any(s.split()[1] == "cuda:" for s in lines), lines)

    def test_every_model_command_takes_device(self):
        # A GPU to run on: a build with the CUDA backend that also found a device.
        has_cuda = any(s.split()[1:3] == ["cuda:", "yes"] and "no CUDA device" not in s for s in self.info_backends())
        for cmd in COMMANDS:
            r = dory(*cmd, "--device", "bogus")
            self.assertNotEqual(r.returncode, 0, cmd)
            self.assertIn("--device", r.stderr, cmd)
            if has_cuda:
                continue
            r = dory(*cmd, "--device", "cuda")
            self.assertEqual(r.returncode, 1, (cmd, r.stderr))
            err = r.stderr.strip().splitlines()
            self.assertEqual(len(err), 1, (cmd, err))
            self.assertIn("--device cuda", err[0])
            self.assertIn("CUDA", err[0])

    def test_cpu_and_auto_run(self):
        outs = []
        for dev in ("cpu", "auto"):
            r = dory("run", "-p", "The king said", "-n", "8", "--temp", "0", "--device", dev, "-v")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| cpu: ", r.stderr)
            outs.append(r.stdout)
        self.assertEqual(outs[0], outs[1])


if __name__ == "__main__":
    unittest.main()
