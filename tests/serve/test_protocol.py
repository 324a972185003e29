#!/usr/bin/python3
"""`dory serve` over HTTP: the OpenAI endpoints, streaming, limits, bad input, slots,
disconnects, the API key, loading and shutdown.

The model is a tiny random-weight checkpoint with the vocabulary of a trained tokenizer
(its text is noise), so the tests check what must hold whatever the weights say.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import shutil

sys.dont_write_bytecode = True
from serverlib import Server, make_model, metrics, post_json, request, stream  # noqa: E402

DORY = os.environ.get("DORY_BIN", "")
_TMP = tempfile.mkdtemp(prefix="dory_serve_")
MODEL = os.path.join(_TMP, "model")
CTX = 256  # -c for the shared server: small, so a too-long prompt is cheap to make


def setUpModule():
    if not DORY or not os.access(DORY, os.X_OK):
        raise RuntimeError("DORY_BIN must name the dory binary")
    make_model(MODEL)


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def chat_body(text="Hello there", **kw):
    b = {"model": "x", "messages": [{"role": "user", "content": text}], "max_tokens": 12}
    b.update(kw)
    return b


def content_of(events):
    """The text of a chat or completion stream."""
    out = ""
    for e in events:
        if e == "[DONE]" or not e.get("choices"):
            continue
        c = e["choices"][0]
        out += c.get("text") or c.get("delta", {}).get("content") or ""
    return out


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(DORY, MODEL, "-t", "2", "--parallel", "2", "-c", str(CTX), "--max-body", "65536")
        cls.port = cls.srv.port

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        assert rc == 0, (rc, cls.srv.stderr())

    def post(self, path, body):
        return post_json(self.port, path, body)

    def test_health_and_models(self):
        status, _, data = request(self.port, "GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(data)["status"], "ok")
        status, _, data = request(self.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        m = json.loads(data)
        self.assertEqual(m["object"], "list")
        self.assertEqual(m["data"][0]["id"], "model")  # the directory's name
        self.assertEqual(m["data"][0]["meta"]["n_ctx"], CTX)

    def test_chat_non_streaming(self):
        status, r = self.post("/v1/chat/completions", chat_body(seed=3))
        self.assertEqual(status, 200, r)
        self.assertEqual(r["object"], "chat.completion")
        self.assertTrue(r["id"].startswith("chatcmpl-"))
        c = r["choices"][0]
        self.assertEqual(c["message"]["role"], "assistant")
        self.assertIsInstance(c["message"]["content"], str)
        self.assertIn(c["finish_reason"], ("stop", "length"))
        u = r["usage"]
        self.assertGreater(u["prompt_tokens"], 0)
        self.assertLessEqual(u["completion_tokens"], 12)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
        for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_per_second", "cache_n"):
            self.assertIn(k, r["timings"])

    def test_chat_streaming_equals_non_streaming(self):
        body = chat_body("Tell me a story", temperature=0, max_tokens=20)
        status, whole = self.post("/v1/chat/completions", body)
        self.assertEqual(status, 200)
        status, events = stream(self.port, "/v1/chat/completions", body)
        self.assertEqual(status, 200)
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"])
        self.assertEqual(content_of(events), whole["choices"][0]["message"]["content"])
        self.assertIn("timings", chunks[-1])

    def test_stream_include_usage(self):
        status, events = stream(self.port, "/v1/chat/completions",
                                chat_body(stream_options={"include_usage": True}, max_tokens=5))
        self.assertEqual(status, 200)
        usage = [e for e in events if e != "[DONE]" and "usage" in e]
        self.assertEqual(len(usage), 1)
        self.assertEqual(usage[0]["choices"], [])
        self.assertLessEqual(usage[0]["usage"]["completion_tokens"], 5)

    def test_completions_streaming_and_not_and_token_prompts(self):
        body = {"prompt": "The king said", "max_tokens": 16, "temperature": 0}
        status, whole = self.post("/v1/completions", body)
        self.assertEqual(status, 200, whole)
        self.assertEqual(whole["object"], "text_completion")
        text = whole["choices"][0]["text"]
        status, events = stream(self.port, "/v1/completions", body)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(content_of(events), text)
        # The same prompt as token ids (from /tokenize), and as a list of one prompt.
        _, t = self.post("/tokenize", {"content": "The king said"})
        status, by_ids = self.post("/v1/completions", dict(body, prompt=t["tokens"]))
        self.assertEqual(status, 200, by_ids)
        self.assertEqual(by_ids["choices"][0]["text"], text)
        status, listed = self.post("/v1/completions", dict(body, prompt=["The king said"]))
        self.assertEqual(listed["choices"][0]["text"], text)

    def test_stop_string_cuts_the_output(self):
        body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        _, whole = self.post("/v1/completions", body)
        text = whole["choices"][0]["text"]
        self.assertGreater(len(text), 12, text)
        stop = text[len(text) // 2:len(text) // 2 + 3]
        want = text[:text.find(stop)]
        for streaming in (False, True):
            if streaming:
                _, events = stream(self.port, "/v1/completions", dict(body, stop=[stop]))
                got = content_of(events)
                finish = [e for e in events if e != "[DONE]"][-1]["choices"][0]["finish_reason"]
            else:
                _, r = self.post("/v1/completions", dict(body, stop=stop))
                got, finish = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
            self.assertEqual(got, want, (streaming, stop))
            self.assertEqual(finish, "stop")

    def test_seed_reproduces(self):
        body = chat_body("Say something", temperature=1.0, top_k=0, top_p=1.0, min_p=0, max_tokens=16)
        outs = [self.post("/v1/chat/completions", dict(body, seed=s))[1]["choices"][0]["message"]["content"]
                for s in (42, 42, 43)]
        self.assertEqual(outs[0], outs[1])
        self.assertNotEqual(outs[0], outs[2])

    def test_dory_extras_are_accepted(self):
        status, r = self.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "top_k": 5, "min_p": 0.1,
                                                  "repeat_penalty": 1.1, "loops": 3, "n": 1})
        self.assertEqual(status, 200, r)

    def test_loops_change_the_answer(self):
        body = {"prompt": "The king said", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        a = self.post("/v1/completions", dict(body, loops=1))[1]["choices"][0]["text"]
        b = self.post("/v1/completions", dict(body, loops=4))[1]["choices"][0]["text"]
        c = self.post("/v1/completions", dict(body, loops=1))[1]["choices"][0]["text"]
        self.assertNotEqual(a, b)
        self.assertEqual(a, c)  # a slot cached at another loop count is not reused

    def test_tokenize_detokenize_round_trip(self):
        status, t = self.post("/tokenize", {"content": "Hello, world! ünïcödé"})
        self.assertEqual(status, 200)
        self.assertTrue(all(isinstance(i, int) for i in t["tokens"]))
        status, d = self.post("/detokenize", {"tokens": t["tokens"]})
        self.assertEqual(d["content"], "Hello, world! ünïcödé")
        status, p = self.post("/tokenize", {"content": "Hello", "with_pieces": True})
        self.assertEqual("".join(x["piece"] for x in p["tokens"]), "Hello")

    def test_prompt_reuse_goes_to_the_slot_with_the_longest_prefix(self):
        a = "alpha " * 30
        b = "omega " * 30
        base = {"max_tokens": 1, "temperature": 0}
        self.post("/v1/completions", dict(base, prompt=a))
        self.post("/v1/completions", dict(base, prompt=b))
        _, r = self.post("/v1/completions", dict(base, prompt=a + "and more"))
        self.assertGreaterEqual(r["usage"]["prompt_tokens_details"]["cached_tokens"], 25, r["usage"])
        self.assertEqual(r["timings"]["prompt_n"] + r["timings"]["cache_n"], r["usage"]["prompt_tokens"])

    def test_generation_stops_at_the_context_end(self):
        _, t = self.post("/tokenize", {"content": "word " * 400})
        prompt = t["tokens"][:CTX - 10]
        status, r = self.post("/v1/completions", {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True})
        self.assertEqual(status, 200, r)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")
        self.assertLessEqual(r["usage"]["total_tokens"], CTX)
        self.assertGreaterEqual(r["usage"]["total_tokens"], CTX - 1)

    def test_concurrent_requests_are_batched(self):
        before = metrics(self.port)
        results = [None] * 5  # more than the 2 slots: the rest wait their turn
        def one(i):
            results[i] = stream(self.port, "/v1/completions",
                                {"prompt": "Request %d" % i, "max_tokens": 40, "ignore_eos": True})
        threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for status, events in results:
            self.assertEqual(status, 200)
            self.assertEqual(events[-1], "[DONE]")
        after = metrics(self.port)
        steps = after["dory_batch_steps_total"] - before["dory_batch_steps_total"]
        decode = after["dory_batch_decode_rows_total"] - before["dory_batch_decode_rows_total"]
        self.assertGreater(decode / steps, 1.3, (decode, steps))  # several slots per step
        self.assertEqual(after["dory_generated_tokens_total"] - before["dory_generated_tokens_total"], 200)

    def test_metrics(self):
        self.post("/v1/completions", {"prompt": "Count me", "max_tokens": 3, "ignore_eos": True})
        m = metrics(self.port)
        for k in ("dory_prompt_tokens_total", "dory_generated_tokens_total", "dory_generation_tokens_per_second",
                  "dory_prompt_tokens_per_second", "dory_requests_in_flight", "dory_requests_queued",
                  "dory_kv_cache_bytes", 'dory_http_responses_total{code="200"}'):
            self.assertIn(k, m)
        self.assertGreaterEqual(m["dory_generated_tokens_total"], 3)
        self.assertGreater(m["dory_kv_cache_bytes"], 0)

    def test_bad_requests_get_400_and_the_server_keeps_serving(self):
        P, C = "/v1/chat/completions", "/v1/completions"
        msgs = [{"role": "user", "content": "hi"}]
        cases = [
            (P, b"{not json", None),
            (P, b"", None),
            (P, b"[1, 2]", None),
            (P, b'{"messages": [{"role": "user", "content": "\xff\xfe bad utf-8"}]}', None),
            (P, b'{"messages": "' + b"\xc3" + b'"}', None),
            (P, b"[" * 60000, None),  # deep nesting, under the body limit
            (P, {"max_tokens": 3}, "messages"),
            (P, {"messages": "hi"}, "messages"),
            (P, {"messages": []}, "messages"),
            (P, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
            (P, {"messages": [{"content": "hi"}]}, "messages[0].role"),
            (P, {"messages": [{"role": "user"}]}, "messages[0].content"),
            (P, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            (P, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
            (P, {"messages": msgs, "max_tokens": "ten"}, "max_tokens"),
            (P, {"messages": msgs, "max_tokens": -5}, "max_tokens"),
            (P, {"messages": msgs, "max_tokens": 1e30}, "max_tokens"),
            (P, {"messages": msgs, "temperature": -1}, "temperature"),
            (P, {"messages": msgs, "temperature": "hot"}, "temperature"),
            (P, {"messages": msgs, "temperature": 1e9}, "temperature"),
            (P, {"messages": msgs, "top_p": 1.5}, "top_p"),
            (P, {"messages": msgs, "top_k": -3}, "top_k"),
            (P, {"messages": msgs, "min_p": 2}, "min_p"),
            (P, {"messages": msgs, "repeat_penalty": 0}, "repeat_penalty"),
            (P, {"messages": msgs, "presence_penalty": 9}, "presence_penalty"),
            (P, {"messages": msgs, "seed": "abc"}, "seed"),
            (P, {"messages": msgs, "seed": -7}, "seed"),
            (P, {"messages": msgs, "n": 2}, "n"),
            (P, {"messages": msgs, "stream": "yes"}, "stream"),
            (P, {"messages": msgs, "stop": 5}, "stop"),
            (P, {"messages": msgs, "stop": ["a"] * 17}, "stop"),
            (P, {"messages": msgs, "loops": 0}, "loops"),
            (P, {"messages": msgs, "loops": 17}, "loops"),
            (P, {"messages": msgs, "logprobs": True}, "logprobs"),
            (P, {"messages": msgs, "model": 7}, "model"),
            (C, {"prompt": 5}, "prompt"),
            (C, {"prompt": ["a", "b"]}, "prompt"),
            (C, {"prompt": [1, -2]}, "prompt"),
            (C, {"prompt": [1, 10 ** 12]}, "prompt"),
            (C, {"prompt": [1, 2.5]}, "prompt"),
            (C, {"prompt": ""}, "prompt"),
            (C, {}, "prompt"),
            (C, {"prompt": "hi", "echo": True}, "echo"),
            ("/tokenize", {"content": 5}, "content"),
            ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
            ("/detokenize", {"tokens": "abc"}, "tokens"),
        ]
        for path, body, param in cases:
            with self.subTest(path=path, body=body if not isinstance(body, bytes) else body[:40]):
                status, _, data = request(self.port, "POST", path, body,
                                          headers={"Content-Type": "application/json"})
                self.assertEqual(status, 400, data[:300])
                err = json.loads(data)["error"]
                self.assertIsInstance(err["message"], str)
                self.assertNotIn("\n", err["message"])
                self.assertEqual(err["type"], "invalid_request_error")
                if param:
                    self.assertEqual(err["param"], param, err)
        status, r = self.post(C, {"prompt": "still here", "max_tokens": 2})
        self.assertEqual(status, 200, r)

    def test_prompt_longer_than_the_context(self):
        status, r = self.post("/v1/completions", {"prompt": "word " * (CTX + 50), "max_tokens": 2})
        self.assertEqual(status, 400)
        self.assertEqual(r["error"]["code"], "context_length_exceeded")
        status, r = self.post("/v1/chat/completions", chat_body("word " * (CTX + 50)))
        self.assertEqual(status, 400)

    def test_body_size_limit_and_unknown_endpoints(self):
        status, _, data = request(self.port, "POST", "/v1/completions", b"x" * 70000)
        self.assertEqual(status, 413)
        self.assertIn("limit", json.loads(data)["error"]["message"])
        status, _, data = request(self.port, "GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(data)["error"]["type"], "not_found_error")
        status, _, _ = request(self.port, "GET", "/health")
        self.assertEqual(status, 200)


def raw_stream_then_drop(port, body, read_events=3):
    """Starts a stream on a raw socket, reads a few events, and disconnects."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    got = b""
    while got.count(b"data: ") < read_events:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    return got


class Faults(unittest.TestCase):
    def test_a_client_that_disconnects_frees_its_slot(self):
        srv = Server(DORY, MODEL, "-t", "2", "--parallel", "1")
        try:
            long_job = {"prompt": "Go on forever", "max_tokens": 100000, "ignore_eos": True}
            got = raw_stream_then_drop(srv.port, long_job)
            self.assertIn(b"data: ", got)
            t0 = time.time()
            while metrics(srv.port)["dory_requests_in_flight"] != 0:
                self.assertLess(time.time() - t0, 2.0, "the slot stayed busy after the client left")
                time.sleep(0.02)
            # The only slot serves the next request at once.
            status, r = post_json(srv.port, "/v1/completions", {"prompt": "next", "max_tokens": 3}, timeout=10)
            self.assertEqual(status, 200)
            m = metrics(srv.port)
            self.assertGreaterEqual(m["dory_requests_cancelled_total"], 1)
            self.assertLess(m["dory_generated_tokens_total"], 50000)
            # A non-streaming request: its connection is watched too.
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            data = json.dumps(long_job).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
            time.sleep(0.3)
            s.close()
            t0 = time.time()
            while metrics(srv.port)["dory_requests_in_flight"] != 0:
                self.assertLess(time.time() - t0, 2.0, "a non-streaming request kept its slot")
                time.sleep(0.02)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_api_key(self):
        srv = Server(DORY, MODEL, "-t", "1", "--api-key", "sekrit", wait_ready=False)
        try:
            srv.wait_ready()  # /health needs no key
            for path in ("/v1/models", "/metrics"):
                status, _, data = request(srv.port, "GET", path)
                self.assertEqual(status, 401)
                self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
                status, _, _ = request(srv.port, "GET", path, headers={"Authorization": "Bearer wrong!"})
                self.assertEqual(status, 401)
                status, _, _ = request(srv.port, "GET", path, headers={"Authorization": "Bearer sekrit"})
                self.assertEqual(status, 200)
            status, _ = post_json(srv.port, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 401)
            status, r = post_json(srv.port, "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                  headers={"Authorization": "Bearer sekrit"})
            self.assertEqual(status, 200, r)
        finally:
            self.assertEqual(srv.stop(), 0)


class Lifecycle(unittest.TestCase):
    def test_health_is_503_while_loading(self):
        srv = Server(DORY, MODEL, "-t", "1", env={"DORY_SERVE_TEST_LOAD_DELAY_MS": "1500"}, wait_ready=False)
        try:
            status, _, data = request(srv.port, "GET", "/health")
            self.assertEqual(status, 503)
            self.assertEqual(json.loads(data)["status"], "loading")
            status, _, data = request(srv.port, "POST", "/v1/completions", {"prompt": "hi"})
            self.assertEqual(status, 503)
            self.assertEqual(json.loads(data)["error"]["type"], "unavailable_error")
            srv.wait_ready()
            status, _, _ = request(srv.port, "GET", "/health")
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_sigint_and_sigterm_shut_down_cleanly_mid_stream(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            srv = Server(DORY, MODEL, "-t", "2", "--parallel", "2")
            got = {}
            def run():
                got["r"] = stream(srv.port, "/v1/completions",
                                  {"prompt": "x", "max_tokens": 100000, "ignore_eos": True})
            th = threading.Thread(target=run)
            th.start()
            time.sleep(0.5)
            t0 = time.time()
            self.assertEqual(srv.stop(sig), 0, srv.stderr())
            self.assertLess(time.time() - t0, 10)
            th.join(10)
            self.assertIn("shutting down", srv.stderr())

    def test_flags_and_startup_errors_are_one_line(self):
        r = subprocess.run([DORY, "serve", "--help"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        for flag in ("--host", "--port", "--parallel", "--ctx-size", "--api-key", "--threads", "--max-body",
                     "--temp", "--n-predict"):
            self.assertIn(flag, r.stdout)
        self.assertIn("127.0.0.1", r.stdout)
        self.assertIn("8080", r.stdout)
        for args in (["--port", "70000"], ["--parallel", "0"]):  # CLI11's own messages
            r = subprocess.run([DORY, "serve", "-m", MODEL, *args], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(args[0], r.stderr.splitlines()[0])
        for args in (["-c", "100000"], ["--host", "256.1.1.1"]):
            r = subprocess.run([DORY, "serve", "-m", MODEL, "--port", "0", *args], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 1, args)
            errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
            self.assertEqual(len(errors), 1, (args, r.stderr))
        # A port in use.
        srv = Server(DORY, MODEL, "-t", "1")
        try:
            r = subprocess.run([DORY, "serve", "-m", MODEL, "--port", str(srv.port)], capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("cannot listen on 127.0.0.1:%d" % srv.port, r.stderr)
        finally:
            srv.stop()
        # A model without a tokenizer.
        bare = os.path.join(_TMP, "bare")
        subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "scripts", "make_checkpoint.py"), "--out", bare, "--quiet"], check=True)
        r = subprocess.run([DORY, "serve", "-m", bare, "--port", "0"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len([l for l in r.stderr.splitlines() if l.startswith("error:")]), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
