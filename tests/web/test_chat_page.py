#!/usr/bin/python3
"""The chat page at / of dory serve, in a real browser: Debian's headless Chromium, driven by
puppeteer-core (npm, tests/web/package.json, installed into tests/web/node_modules on first
use), loads the page from a `dory serve --api-key` on loopback, is refused without the key,
sends a message and sees the answer stream in (several lengths while it is generating, the
link throttled by DevTools), stops a second one mid-stream, starts a new chat and finds both
conversations again after a reload (localStorage); its Markdown renderer is checked on a
fixed text. On a CMF model with skills it offers a choice of skill, which the request carries. The screenshot is kept as build/test-artifacts/chat_page.png (beside DORY_BIN).

    DORY_BIN=build/dory /usr/bin/python3 tests/web/test_chat_page.py -v
"""
import json
import os
import shutil
import socket
import subprocess
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DORY = os.environ.get("DORY_BIN", os.path.join(ROOT, "build", "dory"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or ""
NODE = shutil.which("node") or ""
KEY = "page-test-key"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class ChatPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not CHROMIUM or not NODE:
            raise RuntimeError("the chat page test needs chromium and node (scripts/apt-packages.txt)")
        if not os.path.isdir(os.path.join(HERE, "node_modules", "puppeteer-core")):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True)
        cls.port = free_port()
        cls.url = "http://127.0.0.1:%d/" % cls.port
        cls.log = open(os.path.join(os.path.dirname(os.path.abspath(DORY)), "chat_page_serve.log"), "w")
        cls.srv = subprocess.Popen([DORY, "serve", "--port", str(cls.port), "--api-key", KEY, "-t", "2"],
                                   stdout=cls.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            try:
                urllib.request.urlopen(cls.url + "health", timeout=1).read()
                break
            except Exception:
                time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        cls.srv.terminate()
        cls.srv.wait(10)
        cls.log.close()

    def test_page_in_a_browser(self):
        # Served by the binary, without the key (it holds no data), as HTML.
        with urllib.request.urlopen(self.url) as r:
            self.assertEqual(r.status, 200)
            self.assertIn("text/html", r.headers["Content-Type"])
            self.assertIn(b"<title>dory chat</title>", r.read())
        art = os.path.join(os.path.dirname(os.path.abspath(DORY)), "test-artifacts")
        os.makedirs(art, exist_ok=True)
        shot = os.path.join(art, "chat_page.png")
        r = subprocess.run([NODE, os.path.join(HERE, "chat_page.mjs"), self.url, KEY, shot, CHROMIUM],
                           capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        got = json.loads(r.stdout.strip().splitlines()[-1])
        print("  " + json.dumps({k: v for k, v in got.items() if k not in ("markdown", "answer")}), flush=True)
        self.assertEqual(got["title"], "dory chat")
        self.assertEqual(got["page_errors"], [])
        md = got["markdown"]
        for want in ("<h1>Title</h1>", "<strong>bold</strong>", "<code>x&lt;y</code>",
                     '<pre><code class="lang-python">if a &lt; b:\n    pass</code></pre>', "<ul><li>one</li><li>two</li></ul>"):
            self.assertIn(want, md)
        self.assertIn("API key", got["no_key_status"])
        # Streamed: the answer was seen at several lengths while it was being generated.
        self.assertGreaterEqual(len(got["stream_lengths"]), 3, got["stream_lengths"])
        self.assertGreater(len(got["answer"].strip()), 0)
        # Stopped mid-stream: idle again, said so, and it grew no more.
        self.assertTrue(got["stop_idle"])
        self.assertEqual(got["stop_status"], "stopped")
        self.assertEqual(got["stopped_len"], got["after_wait_len"])
        self.assertGreater(got["stopped_len"], 0)
        # Conversations kept in the browser: 2 chats, the first with its 6 messages.
        self.assertEqual(got["chats_after_new"], 2)
        self.assertEqual(got["chats_after_reload"], 2)
        self.assertEqual(got["messages_after_reload"], 6)
        self.assertGreater(os.path.getsize(shot), 10000)
        self.assertTrue(got["skill_hidden"])

    def test_skill_choice_on_a_model_with_skills(self):
        """A CMF model with a routable skill ("alt", as tests/serve/test_skill_server.py makes
        it): the page offers the server's skill, none, auto, dynamic-where-possible and alt;
        with alt chosen, the request runs on alt's engine (the server's log says it loaded)."""
        import sys
        import tempfile
        sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
        from serverlib import make_model  # noqa: E402
        tmp = tempfile.mkdtemp(prefix="dory-page-skill-")
        try:
            base = make_model(os.path.join(tmp, "base"))
            with open(os.path.join(base, "config.json")) as f:
                cfg = json.load(f)
            ft = os.path.join(tmp, "ft")
            subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", ft,
                            "--seed", "5", "--set", "vocab_size=%d" % cfg["vocab_size"],
                            "--set", "max_position_embeddings=%d" % cfg["max_position_embeddings"], "--quiet"],
                           check=True)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(base, f), ft)
            for args in (("convert", base, os.path.join(tmp, "base.cmf"), "--type", "bf16"),
                         ("convert", ft, os.path.join(tmp, "ft.cmf"), "--type", "bf16")):
                subprocess.run([DORY, *args], check=True, capture_output=True)
            ids = os.path.join(tmp, "p.ids")
            with open(ids, "w") as f:
                f.write("1,2,3,4,5,6,7,8\n9,10,11,12,13,14\n")
            model = os.path.join(tmp, "two.cmf")
            subprocess.run([DORY, "skill", "add", "-m", os.path.join(tmp, "base.cmf"), "--from",
                            os.path.join(tmp, "ft.cmf"), "--id", "alt", "--prompt-ids", ids, "--rank", "2", "-o", model],
                           check=True, capture_output=True)
            port = free_port()
            log = os.path.join(tmp, "serve.log")
            with open(log, "w") as lf:
                srv = subprocess.Popen([DORY, "serve", "-m", model, "--port", str(port), "-t", "2"], stdout=lf,
                                       stderr=subprocess.STDOUT)
                try:
                    for _ in range(200):
                        try:
                            urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1).read()
                            break
                        except Exception:
                            time.sleep(0.1)
                    r = subprocess.run([NODE, os.path.join(HERE, "skill_select.mjs"), "http://127.0.0.1:%d/" % port,
                                        CHROMIUM], capture_output=True, text=True, timeout=120)
                finally:
                    srv.terminate()
                    srv.wait(10)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            got = json.loads(r.stdout.strip().splitlines()[-1])
            print("  " + json.dumps(got), flush=True)
            self.assertEqual(got["page_errors"], [])
            self.assertFalse(got["skill_hidden"])
            self.assertEqual(got["options"][0], "")
            for want in ("none", "auto", "alt"):
                self.assertIn(want, got["options"])
            self.assertEqual(got["saved"], "alt")
            self.assertNotIn("error", got["status"])
            with open(log) as f:
                self.assertIn("skill 'alt' loaded", f.read())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
