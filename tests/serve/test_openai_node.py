#!/usr/bin/python3
"""`dory serve` end to end through the official `openai` npm client (tests/serve/node).

The package is pinned in node/package-lock.json and installed with `npm ci` into the
git-ignored node/node_modules the first time (npm's cache makes later installs offline).
The node script starts and stops the server itself on a free loopback port.
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
from serverlib import make_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.join(HERE, "node")
DORY = os.environ.get("DORY_BIN", "")


def installed_matches_lock():
    try:
        with open(os.path.join(NODE_DIR, "package-lock.json"), encoding="utf-8") as f:
            want = json.load(f)["packages"]["node_modules/openai"]["version"]
        with open(os.path.join(NODE_DIR, "node_modules", "openai", "package.json"), encoding="utf-8") as f:
            return json.load(f)["version"] == want
    except (OSError, KeyError, ValueError):
        return False


def npm_ci():
    # One install at a time (several build trees may run this suite at once).
    with open(os.path.join(tempfile.gettempdir(), "dory_serve_npm.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_matches_lock():
            return
        r = subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError("npm ci failed in %s:\n%s%s" % (NODE_DIR, r.stdout, r.stderr))


class OpenAINodeClient(unittest.TestCase):
    def test_openai_npm_client_end_to_end(self):
        if not shutil.which("node") or not shutil.which("npm"):
            self.skipTest("node/npm not installed: the openai npm client test cannot run")
        self.assertTrue(DORY and os.access(DORY, os.X_OK), "DORY_BIN must name the dory binary")
        npm_ci()
        tmp = tempfile.mkdtemp(prefix="dory_serve_node_")
        try:
            model = make_model(os.path.join(tmp, "model"))
            env = dict(os.environ, DORY_BIN=DORY, DORY_SERVE_MODEL=model)
            r = subprocess.run(["node", "openai_client.mjs"], cwd=NODE_DIR, env=env, capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("# fail 0", r.stdout, r.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
