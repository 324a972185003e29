#!/usr/bin/python3
"""PEFT LoRA adapters at run time (--lora DIR[:SCALE]): the logits equal those of a checkpoint
with the adapters merged into its weights (numpy: W + scale * lora_alpha / r * B @ A), and the
base weights stay untouched.
"""
import json
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gguf"))
sys.dont_write_bytecode = True
import st_np as ST  # noqa: E402
DORY = os.environ.get("DORY_BIN", "")
# Both runs in float inputs: BF16 products on a CPU with AVX512_BF16 round their input to bf16
# by default, which the merged F32 checkpoint's products do not.
ENV = dict(os.environ, DORY_BF16_INPUT="float")
# The merged checkpoint computes sum((W + dW) x), dory sum(W x) + B (A x): the same numbers summed
# in another order, ~1e-7 relative each; over the tiny model's 12 layers x 2 loops the logits
# (magnitude ~5-10) moved by 3.2e-5 (adapters of std 0.05; 4.9e-4 with std 0.3, whose effect
# was 74). 1e-3 still catches a wrong scale, row or module: the adapter itself moves the logits
# by ~11, checked below to be over 0.1.
TOL = 1e-3


def read_st(path):
    return {k: ST.to_f32(*v) for k, v in ST.read(path).items()}


write_st = ST.write_f32


class Lora(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp, cls.base, cfg = ST.tiny_checkpoint("dory_lora_")
        cls.vocab = cfg["vocab_size"]
        w = read_st(os.path.join(cls.base, "model.safetensors"))
        mlp = [i for i, ch in enumerate(cfg["hybrid_layer_pattern"]) if ch == "-"][0]
        targets = ["backbone.layers.0.mixer.q_proj", "backbone.layers.%d.mixer.up_proj" % mlp, "lm_head"]
        rng = np.random.default_rng(4)
        r, alpha, user = 4, 8.0, 0.5
        adapter, merged = {}, dict(w)
        for t in targets:
            out_dim, in_dim = w[t + ".weight"].shape
            a = rng.standard_normal((r, in_dim)).astype(np.float32) * 0.05
            b = rng.standard_normal((out_dim, r)).astype(np.float32) * 0.05
            adapter["base_model.model." + t + ".lora_A.weight"] = a
            adapter["base_model.model." + t + ".lora_B.weight"] = b
            merged[t + ".weight"] = w[t + ".weight"] + np.float32(user * alpha / r) * (b @ a)
        cls.adapter = os.path.join(cls.tmp, "adapter")
        os.makedirs(cls.adapter)
        write_st(os.path.join(cls.adapter, "adapter_model.safetensors"), adapter)
        json.dump({"r": r, "lora_alpha": alpha, "target_modules": ["q_proj", "up_proj", "lm_head"],
                   "peft_type": "LORA"}, open(os.path.join(cls.adapter, "adapter_config.json"), "w"))
        cls.merged = os.path.join(cls.tmp, "merged")
        os.makedirs(cls.merged)
        shutil.copy(os.path.join(cls.base, "config.json"), cls.merged)
        write_st(os.path.join(cls.merged, "model.safetensors"), merged)
        cls.ids = ",".join(map(str, rng.integers(0, cls.vocab, 24)))
        cls.user = user

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def logits(self, model, *flags):
        out = os.path.join(self.tmp, "l.npy")
        r = subprocess.run([DORY, "logits", "-m", model, "--ids", self.ids, "-o", out, *flags], capture_output=True,
                           text=True, env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(out)

    def test_equals_merged_weights(self):
        got = self.logits(self.base, "--lora", "%s:%g" % (self.adapter, self.user))
        want = self.logits(self.merged)
        base = self.logits(self.base)
        d = np.abs(got - want).max()
        print("  lora vs merged: max|d| %.2e; the adapter moves logits by %.2f" % (d, np.abs(want - base).max()))
        self.assertLess(d, TOL)
        self.assertGreater(np.abs(want - base).max(), 0.1)
        # the file given as the safetensors file itself, and a chunked prompt, the same
        got2 = self.logits(self.base, "--lora", os.path.join(self.adapter, "adapter_model.safetensors") + ":0.5",
                           "--chunk", "5")
        self.assertLess(np.abs(got2 - want).max(), TOL)

    def test_bad_adapters_are_one_line_errors(self):
        bad = os.path.join(self.tmp, "bad")
        os.makedirs(bad, exist_ok=True)
        write_st(os.path.join(bad, "adapter_model.safetensors"),
                 {"base_model.model.backbone.layers.0.mixer.nope.lora_A.weight": np.zeros((2, 4), np.float32),
                  "base_model.model.backbone.layers.0.mixer.nope.lora_B.weight": np.zeros((4, 2), np.float32)})
        json.dump({"r": 2, "lora_alpha": 2}, open(os.path.join(bad, "adapter_config.json"), "w"))
        for spec, msg in ((bad, "does not have"), (os.path.join(self.tmp, "missing"), "no adapter_model"),
                          (self.base, "no adapter_model")):
            r = subprocess.run([DORY, "logits", "-m", self.base, "--ids", "1,2", "-o", os.path.join(self.tmp, "x.npy"),
                                "--lora", spec], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, spec)
            self.assertIn(msg, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)



class MergeLora(unittest.TestCase):
    def test_merged_file_equals_the_adapter_at_run_time(self):
        Lora.setUpClass()
        try:
            out = os.path.join(Lora.tmp, "merged.gguf")
            r = subprocess.run([DORY, "convert", Lora.base, out, "--type", "f32", "-q", "--merge-lora",
                                "%s:%g" % (Lora.adapter, Lora.user)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("merged 3 adapted matrices", r.stderr)
            case = Lora()
            merged = case.logits(out)
            want = case.logits(Lora.merged)       # numpy's merge
            live = case.logits(Lora.base, "--lora", "%s:%g" % (Lora.adapter, Lora.user))
            self.assertLess(np.abs(merged - want).max(), TOL)
            self.assertLess(np.abs(merged - live).max(), TOL)
        finally:
            Lora.tearDownClass()


class GgufLora(unittest.TestCase):
    """llama.cpp's GGUF LoRA adapters: the PEFT adapter above written as one (by tests/gguf's
    independent numpy GGUF writer, lora_a in F32 and lora_b in F16 with its rounding in the
    numpy merge), on the model's GGUF tensor names; the logits equal numpy's merge."""

    def test_gguf_adapter_equals_merged_weights(self):
        import gguf_min as G
        Lora.setUpClass()
        try:
            case = Lora()
            tmp = Lora.tmp
            w = read_st(os.path.join(Lora.base, "model.safetensors"))
            ad = read_st(os.path.join(Lora.adapter, "adapter_model.safetensors"))
            cfg = json.load(open(os.path.join(Lora.base, "config.json")))
            mlp = [i for i, ch in enumerate(cfg["hybrid_layer_pattern"]) if ch == "-"][0]
            names = {"backbone.layers.0.mixer.q_proj": "blk.0.attn_q",
                     "backbone.layers.%d.mixer.up_proj" % mlp: "blk.%d.ffn_up" % mlp, "lm_head": "output"}
            r, alpha, user = 4, 8.0, 0.5
            tensors, merged = [], dict(w)
            for hf, gg in names.items():
                a = ad["base_model.model." + hf + ".lora_A.weight"]
                b = ad["base_model.model." + hf + ".lora_B.weight"].astype(np.float16)
                tensors.append((gg + ".weight.lora_a", G.T_F32, list(a.shape), a.tobytes()))
                tensors.append((gg + ".weight.lora_b", G.T_F16, list(b.shape), b.tobytes()))
                merged[hf + ".weight"] = w[hf + ".weight"] + np.float32(user * alpha / r) * (b.astype(np.float32) @ a)
            kvs = [("general.architecture", G.STRING, "dory"), ("general.type", G.STRING, "adapter"),
                   ("adapter.type", G.STRING, "lora"), ("adapter.lora.alpha", G.F32, alpha)]
            path = os.path.join(tmp, "adapter.gguf")
            G.write(path, kvs, tensors)
            mdir = os.path.join(tmp, "merged_f16b")
            os.makedirs(mdir)
            shutil.copy(os.path.join(Lora.base, "config.json"), mdir)
            write_st(os.path.join(mdir, "model.safetensors"), merged)
            got = case.logits(Lora.base, "--lora", "%s:%g" % (path, user))
            want = case.logits(mdir)
            d = float(np.abs(got - want).max())
            print("  gguf lora vs merged: max|d| %.2e" % d)
            self.assertLess(d, TOL)
            # merged into a file from the GGUF adapter: the same logits
            out = os.path.join(tmp, "merged_from_gguf.gguf")
            rr = subprocess.run([DORY, "convert", Lora.base, out, "--type", "f32", "-q", "--merge-lora",
                                 "%s:%g" % (path, user)], capture_output=True, text=True)
            self.assertEqual(rr.returncode, 0, rr.stderr)
            self.assertLess(np.abs(case.logits(out) - want).max(), TOL)
            # a model file, an adapter for another architecture, a missing lora_b: one-line errors
            bad_arch = os.path.join(tmp, "llama.gguf")
            G.write(bad_arch, [("general.architecture", G.STRING, "llama")] + kvs[1:], tensors)
            no_b = os.path.join(tmp, "no_b.gguf")
            G.write(no_b, kvs, tensors[:1])
            model = os.path.join(tmp, "model.gguf")
            subprocess.run([DORY, "convert", Lora.base, model, "--type", "f32", "-q"], check=True,
                           capture_output=True)
            for spec, msg in ((bad_arch, "not for dory"), (no_b, "no lora_b"), (model, "not a LoRA adapter")):
                rr = subprocess.run([DORY, "logits", "-m", Lora.base, "--ids", "1,2", "-o",
                                     os.path.join(tmp, "x.npy"), "--lora", spec], capture_output=True, text=True)
                self.assertEqual(rr.returncode, 1, spec)
                self.assertIn(msg, rr.stderr)
                self.assertEqual(len(rr.stderr.strip().splitlines()), 1, rr.stderr)
        finally:
            Lora.tearDownClass()



class ServeLora(unittest.TestCase):
    """A `lora` field per server request (llama-server's form, [{"id": N, "scale": X}]): one
    loaded model serves requests with different adapter scales, in the same batch too; a
    prompt cached under one scale is not reused under another."""

    @classmethod
    def setUpClass(cls):
        import socket
        import tempfile
        import time
        import urllib.request
        cls.tmp = tempfile.mkdtemp(prefix="dory_lora_serve_")
        mini = os.path.join(ROOT, "models", "dory-mini")
        rng = np.random.default_rng(9)
        ad = {}
        for t, (o, i) in (("backbone.layers.0.mixer.q_proj", (256, 256)), ("lm_head", (4096, 256))):
            ad["base_model.model." + t + ".lora_A.weight"] = rng.standard_normal((8, i)).astype(np.float32) * 0.3
            ad["base_model.model." + t + ".lora_B.weight"] = rng.standard_normal((o, 8)).astype(np.float32) * 0.3
        cls.adapter = os.path.join(cls.tmp, "adapter")
        os.makedirs(cls.adapter)
        write_st(os.path.join(cls.adapter, "adapter_model.safetensors"), ad)
        json.dump({"r": 8, "lora_alpha": 8}, open(os.path.join(cls.adapter, "adapter_config.json"), "w"))
        cls.servers = []

        def serve(*flags):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            p = subprocess.Popen([DORY, "serve", "-m", mini, "--port", str(port), "--parallel", "2", "-t", "2", *flags],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
            cls.servers.append(p)
            url = "http://127.0.0.1:%d" % port
            for _ in range(200):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1).read()
                    break
                except Exception:
                    time.sleep(0.1)
            return url

        cls.url = serve("--lora", "%s:0.5" % cls.adapter)
        cls.base_url = serve()

    @classmethod
    def tearDownClass(cls):
        for p in cls.servers:
            p.terminate()
            p.wait(10)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def complete(self, url, lora=None, prompt="The king said"):
        import urllib.error
        import urllib.request
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        if lora is not None:
            body["lora"] = lora
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            return json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]["message"]

    def test_scales_per_request(self):
        default = self.complete(self.url)
        half = self.complete(self.url, [{"id": 0, "scale": 0.5}])
        off = self.complete(self.url, [])
        zero = self.complete(self.url, [{"id": 0, "scale": 0}])
        one = self.complete(self.url, [{"id": 0, "scale": 1.0}])
        base = self.complete(self.base_url)
        print("  base %r | lora 0.5 %r | lora 1.0 %r" % (base[:30], half[:30], one[:30]))
        self.assertEqual(default, half)       # no field: the --lora scale
        self.assertEqual(off, base)           # an adapter left out runs at 0
        self.assertEqual(zero, base)
        self.assertNotEqual(half, base)       # the adapter matters here
        self.assertNotEqual(one, half)
        # The same prompt again at another scale: not served from the cache of the first.
        self.assertEqual(self.complete(self.url, [{"id": 0, "scale": 0.5}]), half)
        # Two requests at once, in one batch, each with its own scale.
        import concurrent.futures as cf
        with cf.ThreadPoolExecutor(2) as ex:
            f0 = ex.submit(self.complete, self.url, [{"id": 0, "scale": 0}], "The queen said")
            f1 = ex.submit(self.complete, self.url, [{"id": 0, "scale": 1.0}], "The queen said")
            got0, got1 = f0.result(), f1.result()
        self.assertEqual(got0, self.complete(self.base_url, None, "The queen said"))
        self.assertEqual(got1, self.complete(self.url, [{"id": 0, "scale": 1.0}], "The queen said"))

    def test_bad_lora_fields(self):
        for lora, msg in (([{"id": 3}], "not loaded"), ({"id": 0}, "must be an array"),
                          ([{"id": 0, "scale": "x"}], "finite number"), ([{"scale": 1}], "integer id")):
            code, m = self.complete(self.url, lora)
            self.assertEqual(code, 400, m)
            self.assertIn(msg, m)
        code, m = self.complete(self.base_url, [{"id": 0}])
        self.assertEqual(code, 400)
        self.assertIn("no LoRA adapters", m)


if __name__ == "__main__":
    unittest.main()
