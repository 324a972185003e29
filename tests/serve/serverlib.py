"""Helpers for the `dory serve` tests and bench/serve_load.py: a test model with a real
tokenizer, a server process on a free loopback port, and small HTTP/SSE clients
(standard library only)."""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKDIR = os.path.join(ROOT, "tests", "data", "tokenizers")
PY = "/usr/bin/python3"


def make_model(out, tokenizer="gpt2", ctx=4096, extra=()):
    """A tiny random-weight checkpoint with the vocabulary of a trained tokenizer from
    tests/data/tokenizers, the tokenizer files beside it (as a downloaded model)."""
    tok = os.path.join(TOKDIR, tokenizer)
    with open(os.path.join(tok, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    n = max(list(vocab["model"]["vocab"].values()) + [t["id"] for t in vocab.get("added_tokens", [])]) + 1
    args = [PY, os.path.join(ROOT, "scripts", "make_checkpoint.py"), "--out", out, "--set", "vocab_size=%d" % n,
            "--set", "max_position_embeddings=%d" % ctx, "--quiet"]
    for e in extra:
        args += ["--set", e]
    subprocess.run(args, check=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), out)
    return out


LISTEN = re.compile(r"listening on http://([\d.]+):(\d+)")


class Server:
    """`dory serve ... --port 0`; the port is read from its first stderr line."""

    def __init__(self, dory, model, *args, env=None, wait_ready=True, timeout=60):
        self.stderr_lines = []
        self._lock = threading.Lock()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([dory, "serve", "-m", model, "--port", "0", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=full_env)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.port = None
        deadline = time.time() + timeout
        while self.port is None:
            if self.proc.poll() is not None:
                self._reader.join(5)
                self.proc.stderr.close()
                raise RuntimeError("dory serve exited (%d): %s" % (self.proc.returncode, self.stderr()))
            if time.time() > deadline:
                self.kill()
                raise RuntimeError("dory serve did not print its port: " + self.stderr())
            with self._lock:
                for line in self.stderr_lines:
                    m = LISTEN.search(line)
                    if m:
                        self.port = int(m.group(2))
            time.sleep(0.01)
        if wait_ready:
            self.wait_ready(deadline - time.time())

    def _drain(self):
        for raw in self.proc.stderr:
            with self._lock:
                self.stderr_lines.append(raw.decode("utf-8", "replace"))

    def stderr(self):
        with self._lock:
            return "".join(self.stderr_lines)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                status, _, _ = request(self.port, "GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("dory serve exited: " + self.stderr())
            time.sleep(0.02)
        raise RuntimeError("dory serve not ready: " + self.stderr())

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals the server; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._reader.join(5)
        self.proc.stderr.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        self.proc.stderr.close()


def request(port, method, path, body=None, headers=None, timeout=60):
    """One request; body may be bytes or a JSON-able object. Returns (status, headers, bytes)."""
    h = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def post_json(port, path, body, headers=None, timeout=60):
    status, _, data = request(port, "POST", path, body, headers, timeout)
    return status, json.loads(data)


def stream(port, path, body, headers=None, timeout=60):
    """A streaming request: (status, list of the `data:` payloads, JSON-decoded except [DONE])."""
    body = dict(body, stream=True)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        if r.status != 200:
            return r.status, [json.loads(r.read())]
        events = []
        for raw in r:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        return r.status, events
    finally:
        c.close()


def metrics(port, headers=None):
    """/metrics as {name (with labels): value}."""
    status, _, data = request(port, "GET", "/metrics", headers=headers)
    assert status == 200, status
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
