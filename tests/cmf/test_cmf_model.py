#!/usr/bin/python3
"""A Dory model in a CMF file runs: the tiny random checkpoint rewritten as CMF (by the
independent writer) gives the safetensors checkpoint's logits bit for bit when its tensors
stay bf16, and, with its matrices as q8_2f, the logits of an F32 checkpoint holding numpy's
decoding of those q8_2f bytes. The config comes from the header's arch plus a config.json
beside the file, and the two must agree.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import cmf_writer as W  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
import st_np as ST  # noqa: E402

DORY = os.environ.get("DORY_BIN", "")


read_safetensors = ST.read
write_safetensors = ST.write_f32


def bf16_to_f32(raw):
    return ST.to_f32("BF16", [-1], raw)


class CmfModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp, cls.src, cls.config = ST.tiny_checkpoint("dory_cmfm_")
        cls.tensors = read_safetensors(os.path.join(cls.src, "model.safetensors"))
        cls.ids = ",".join(str(i) for i in np.random.default_rng(2).integers(0, cls.config["vocab_size"], 30))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def arch(self):
        c = self.config
        return {"arch_name": "dory", "hidden_size": c["hidden_size"], "intermediate_size": c["intermediate_size"],
                "num_layers": c["num_hidden_layers"], "num_attention_heads": c["num_attention_heads"],
                "num_kv_heads": c["num_key_value_heads"], "head_dim": c["attention_head_dim"],
                "vocab_size": c["vocab_size"], "num_loops": c["n_recurrent_loops"],
                "max_position_embeddings": c["max_position_embeddings"], "rms_norm_eps": 1e-6,
                "layer_types": ["SlidingAttention"] * c["num_hidden_layers"]}

    def write_cmf(self, d, q8_2f):
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), d)
        entries, decoded = [], {}
        for name, (dt, shape, raw) in sorted(self.tensors.items()):
            assert dt == "BF16", dt
            if q8_2f and len(shape) == 2:
                w = bf16_to_f32(raw).reshape(shape)
                payload = W.enc_q8_2f(w)
                entries.append((name, W.Q8_2F, tuple(shape), payload))
                decoded[name] = W.dec_q8_2f(payload, *shape)
            else:
                entries.append((name, W.BF16, tuple(shape), raw))
                decoded[name] = bf16_to_f32(raw).reshape(shape)
        path = os.path.join(d, "model.cmf")
        W.write(path, entries, arch=self.arch(), quant_type="Q8_2F" if q8_2f else "BF16")
        return path, decoded

    def logits(self, model):
        out = os.path.join(self.tmp, "l.npy")
        r = subprocess.run([DORY, "logits", "-m", model, "--ids", self.ids, "-o", out, "-t", "2"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(out)

    def test_bf16_cmf_equals_safetensors(self):
        path, _ = self.write_cmf(os.path.join(self.tmp, "bf16"), q8_2f=False)
        self.assertTrue(np.array_equal(self.logits(path), self.logits(self.src)))

    def test_q8_2f_cmf_runs_as_its_decoding(self):
        # q8_2f runs on the Q8_0 kernels (row scales as the blocks' d, column scales on the
        # input), whose int8 inputs are an approximation of their own: on the random tiny
        # checkpoint that moves logits by O(1) (it amplifies any rounding, as for ggml's Q8_0),
        # so the agreement with the exact decoding is measured on the built-in model instead
        # (ConvertRoundTrips); here the file must load and give finite logits close in rank.
        path, decoded = self.write_cmf(os.path.join(self.tmp, "q82"), q8_2f=True)
        got = self.logits(path)
        self.assertTrue(np.isfinite(got).all())
        self.assertEqual(got.shape, self.logits(self.src).shape)

    def test_shards(self):
        d = os.path.join(self.tmp, "shards")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), d)
        entries = [(n, W.BF16, tuple(shape), raw) for n, (dt, shape, raw) in sorted(self.tensors.items())]
        half = len(entries) // 2
        for no, part in ((1, entries[:half]), (2, entries[half:])):
            W.write(os.path.join(d, "m-%05d-of-00002.cmf" % no), part, arch=self.arch(), quant_type="BF16",
                    extra_header={"shard": {"no": no, "count": 2}})
        for name in ("m-00001-of-00002.cmf", "m-00002-of-00002.cmf"):
            self.assertTrue(np.array_equal(self.logits(os.path.join(d, name)), self.logits(self.src)), name)
        r = subprocess.run([DORY, "verify", os.path.join(d, "m-00002-of-00002.cmf")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("%d tensors" % len(entries), r.stdout)
        # a tensor in both shards; a shard missing
        W.write(os.path.join(d, "m-00002-of-00002.cmf"), entries[half - 1:], arch=self.arch(), quant_type="BF16")
        r = subprocess.run([DORY, "logits", "-m", os.path.join(d, "m-00001-of-00002.cmf"), "--ids", "1", "-o",
                            os.path.join(self.tmp, "x.npy")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("in another shard too", r.stderr)
        os.remove(os.path.join(d, "m-00002-of-00002.cmf"))
        r = subprocess.run([DORY, "logits", "-m", os.path.join(d, "m-00001-of-00002.cmf"), "--ids", "1", "-o",
                            os.path.join(self.tmp, "x.npy")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("shard 2 of 2", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)

    def test_skill_on_shards(self):
        # A sharded file's skills: the records in shard 1's header, a skill's tensor in any
        # shard (here the last); --skill reads it in place of the backbone's as in one file.
        d = os.path.join(self.tmp, "skill_shards")
        os.makedirs(os.path.join(d, "ref"), exist_ok=True)
        for sub in (d, os.path.join(d, "ref")):
            shutil.copy(os.path.join(self.src, "config.json"), sub)
        mlp = [i for i, ch in enumerate(self.config["hybrid_layer_pattern"]) if ch == "-"][0]
        target = "backbone.layers.%d.mixer.down_proj.weight" % mlp
        dt, shape, raw = self.tensors[target]
        changed = (bf16_to_f32(raw) * 0.5).astype(np.float32)
        changed_raw = (changed.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        base = [(n, W.BF16, tuple(s_), r) for n, (t_, s_, r) in sorted(self.tensors.items())]
        half = len(base) // 2
        rec = {"skills": [{"id": "half", "name": "a halved down projection", "layers": [mlp]}]}
        W.write(os.path.join(d, "m-00001-of-00002.cmf"), base[:half], arch=self.arch(), quant_type="BF16",
                extra_header=dict(rec, shard={"no": 1, "count": 2}))
        W.write(os.path.join(d, "m-00002-of-00002.cmf"),
                base[half:] + [("skill.half." + target, W.BF16, tuple(shape), changed_raw)],
                arch=self.arch(), quant_type="BF16", extra_header={"shard": {"no": 2, "count": 2}})
        W.write(os.path.join(d, "ref", "m.cmf"), [(n, t_, s_, changed_raw if n == target else r)
                                                   for n, t_, s_, r in base], arch=self.arch(), quant_type="BF16")
        out = os.path.join(self.tmp, "ss.npy")

        def lg(model, *flags):
            r = subprocess.run([DORY, "logits", "-m", model, *flags, "--ids", self.ids, "-o", out, "-t", "2"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            return np.load(out)
        m = os.path.join(d, "m-00002-of-00002.cmf")
        with_skill, ref, plain = lg(m, "--skill", "half"), lg(os.path.join(d, "ref", "m.cmf")), lg(m)
        self.assertTrue(np.array_equal(with_skill, ref))
        self.assertTrue(np.array_equal(plain, self.logits(self.src)))
        self.assertFalse(np.array_equal(with_skill, plain))
        for shard in ("m-00001-of-00002.cmf", "m-00002-of-00002.cmf"):
            r = subprocess.run([DORY, "info", "-m", os.path.join(d, shard)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"skill +half \(a halved down projection\)")
            self.assertRegex(r.stdout, r"shard +%s of 2" % shard[6])
        # A PEFT adapter on the sharded file: what it gives on the same weights in one file.
        one = os.path.join(d, "one")
        os.makedirs(one, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), one)
        W.write(os.path.join(one, "m.cmf"), base, arch=self.arch(), quant_type="BF16")
        ad = os.path.join(d, "adapter")
        os.makedirs(ad, exist_ok=True)
        rng = np.random.default_rng(5)
        rows, cols = shape
        ST.write_f32(os.path.join(ad, "adapter_model.safetensors"), {
            "base_model.model.%s.lora_A.weight" % target[:-len(".weight")]:
                (rng.standard_normal((4, cols)) * 0.05).astype(np.float32),
            "base_model.model.%s.lora_B.weight" % target[:-len(".weight")]:
                (rng.standard_normal((rows, 4)) * 0.05).astype(np.float32)})
        with open(os.path.join(ad, "adapter_config.json"), "w") as f:
            json.dump({"r": 4, "lora_alpha": 8, "target_modules": ["down_proj"], "peft_type": "LORA"}, f)
        sharded, single = lg(m, "--lora", ad), lg(os.path.join(one, "m.cmf"), "--lora", ad)
        self.assertTrue(np.array_equal(sharded, single))
        self.assertFalse(np.array_equal(sharded, plain))
        # dory skill add on the sharded base: one file with every shard's tensors and both
        # skills, the new one the fine-tune's logits exactly.
        ft = os.path.join(d, "ft")
        os.makedirs(ft, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), ft)
        up = "backbone.layers.%d.mixer.up_proj.weight" % mlp
        W.write(os.path.join(ft, "m.cmf"), [(n, t_, s_, (((bf16_to_f32(r) * 2.0).astype(np.float32).view(np.uint32)
                                                          >> 16).astype(np.uint16).tobytes() if n == up else r))
                                            for n, t_, s_, r in base], arch=self.arch(), quant_type="BF16")
        pf = os.path.join(d, "p.ids")
        with open(pf, "w") as f:
            f.write("1,2,3,4\n5,6,7,8\n9,10,11,12\n")
        added = os.path.join(d, "added.cmf")
        r = subprocess.run([DORY, "skill", "add", "-m", m, "--from", os.path.join(ft, "m.cmf"), "--id", "double",
                            "--prompt-ids", pf, "-o", added], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(np.array_equal(lg(added, "--skill", "double"), lg(os.path.join(ft, "m.cmf"))))
        self.assertTrue(np.array_equal(lg(added, "--skill", "half"), ref))
        self.assertTrue(np.array_equal(lg(added), plain))

    def test_skill_replaces_tensors_by_name(self):
        # A skill that changes one MLP layer's up projection: with --skill its tensor is read in
        # place of the backbone's, exactly as a model whose backbone holds it.
        d = os.path.join(self.tmp, "skill")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), d)
        mlp = [i for i, ch in enumerate(self.config["hybrid_layer_pattern"]) if ch == "-"][1]
        target = "backbone.layers.%d.mixer.up_proj.weight" % mlp
        dt, shape, raw = self.tensors[target]
        # Other weights: -1.5 times the old ones, truncated to bf16 (both files hold these bytes).
        changed = (bf16_to_f32(raw) * -1.5).astype(np.float32)
        changed_raw = (changed.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        base = [(n, W.BF16, tuple(s_), r) for n, (t_, s_, r) in sorted(self.tensors.items())]
        W.write(os.path.join(d, "m.cmf"), base + [("skill.fix." + target, W.BF16, tuple(shape), changed_raw)],
                arch=self.arch(), quant_type="BF16",
                extra_header={"skills": [{"id": "fix", "name": "a fix", "layers": [mlp]}]})
        swapped = [(n, t_, s_, changed_raw if n == target else r) for n, t_, s_, r in base]
        os.makedirs(os.path.join(d, "ref"), exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), os.path.join(d, "ref"))
        W.write(os.path.join(d, "ref", "m.cmf"), swapped, arch=self.arch(), quant_type="BF16")
        m = os.path.join(d, "m.cmf")

        def lg(*flags):
            out = os.path.join(self.tmp, "s.npy")
            r = subprocess.run([DORY, "logits", "-m", *flags, "--ids", self.ids, "-o", out], capture_output=True,
                               text=True)
            return r, (np.load(out) if r.returncode == 0 else None)
        _, with_skill = lg(m, "--skill", "fix")
        _, ref = lg(os.path.join(d, "ref", "m.cmf"))
        _, none = lg(m, "--skill", "none")
        _, base_l = lg(m)
        self.assertTrue(np.array_equal(with_skill, ref))
        self.assertTrue(np.array_equal(none, base_l))
        self.assertTrue(np.array_equal(base_l, self.logits(self.src)))
        self.assertFalse(np.array_equal(with_skill, base_l))
        # The same change as a standalone skill file (feature bit 6, CMF.md section 3.4): the
        # changed tensor under its plain name, the base's directory hash in its one record.
        with open(m, "rb") as f:
            base_hash = struct.unpack("<Q", f.read(128)[0x78:0x80])[0]
        sk = os.path.join(d, "fix-skill.cmf")
        W.write(sk, [(target, W.BF16, tuple(shape), changed_raw)], arch=self.arch(), quant_type="BF16",
                features=1 | 64, extra_header={"skills": [{"id": "fix", "base_dir_hash": "%016x" % base_hash}]})
        _, standalone = lg(m, "--skill", sk)
        self.assertTrue(np.array_equal(standalone, ref))
        other = os.path.join(d, "other-skill.cmf")
        W.write(other, [(target, W.BF16, tuple(shape), changed_raw)], arch=self.arch(), quant_type="BF16",
                features=1 | 64, extra_header={"skills": [{"id": "fix", "base_dir_hash": "%016x" % (base_hash ^ 1)}]})
        plain = os.path.join(d, "plain-skill.cmf")
        W.write(plain, [(target, W.BF16, tuple(shape), changed_raw)], arch=self.arch(), quant_type="BF16",
                extra_header={"skills": [{"id": "fix", "base_dir_hash": "%016x" % base_hash}]})
        for flags, msg in (((m, "--skill", other), "made for the base with directory hash"),
                           ((m, "--skill", plain), "not a standalone skill file"),
                           ((sk,), "does not run on its own"),
                           ((m, "--skill", "nope"), "the file has fix"), ((self.src, "--skill", "fix"), "CMF"),
                           ((m, "--skill", "auto"), "no skill with a router")):
            r, _ = lg(*flags)
            self.assertEqual(r.returncode, 1, flags)
            self.assertIn(msg, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1)

    def test_skill_auto_routes_to_the_resembling_skill(self):
        """Two skills, each with a router fitted here (numpy, CMF.md section 3) from the phi of
        four prompts of its own kind (the float64 reference's hidden state after phi_layer,
        averaged over the prompt): ids drawn from [10, 60) for 'low', [180, 230) for 'high'.
        A new prompt of each kind routes to its skill under --skill auto, runs with exactly
        that skill's tensors, and the E printed for every skill equals numpy's E from the
        reference's phi (float32 engine against float64: bound 1e-4 relative + 1e-6)."""
        import base64
        sys.path.insert(0, os.path.join(ROOT, "scripts", "reference"))
        import dory_ref
        d = os.path.join(self.tmp, "route")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(self.src, "config.json"), d)
        L = self.config["num_hidden_layers"]
        phi_layer = (2 * L) // 3
        ref = dory_ref.load(self.src)
        rng = np.random.default_rng(5)

        def phi(ids):
            ref.forward(ids, capture=phi_layer)
            return ref.captured.mean(axis=0)

        def b64(a):
            return base64.b64encode(np.asarray(a, dtype="<f2").tobytes()).decode()

        kinds = {"low": (10, 60), "high": (180, 230)}
        skills, entries, f16 = [], [], {}
        mlps = [i for i, ch in enumerate(self.config["hybrid_layer_pattern"]) if ch == "-"]
        for n, (kid, (lo, hi)) in enumerate(kinds.items()):
            P = np.stack([phi(rng.integers(lo, hi, 24)) for _ in range(4)])
            mean = P.mean(axis=0)
            _, _, vt = np.linalg.svd(P - mean, full_matrices=False)
            basis = vt[:2]
            f16[kid] = (mean.astype(np.float16).astype(np.float64), basis.astype(np.float16).astype(np.float64))
            skills.append({"id": kid, "layers": [mlps[n]], "selection": {
                "metric": "mse", "phi_layer": phi_layer, "rank": 2, "mean": b64(mean), "basis": b64(basis)}})
            target = "backbone.layers.%d.mixer.up_proj.weight" % mlps[n]
            dt, shape, raw = self.tensors[target]
            changed = (bf16_to_f32(raw) * (-1.5 if n == 0 else 0.5)).astype(np.float32)
            entries.append(("skill.%s.%s" % (kid, target), W.BF16, tuple(shape),
                            (changed.view(np.uint32) >> 16).astype(np.uint16).tobytes()))
        base = [(n_, W.BF16, tuple(s_), r) for n_, (t_, s_, r) in sorted(self.tensors.items())]
        m = os.path.join(d, "m.cmf")
        W.write(m, base + entries, arch=self.arch(), quant_type="BF16", extra_header={"skills": skills})

        def numpy_e(kid, p):
            mean, basis = f16[kid]
            r = p - mean
            return (r @ r - ((basis @ r) ** 2).sum()) / (p @ p)

        out = os.path.join(self.tmp, "r.npy")
        for kid, (lo, hi) in kinds.items():
            ids = [int(i) for i in rng.integers(lo, hi, 24)]
            ids_s = ",".join(map(str, ids))
            r = subprocess.run([DORY, "logits", "-m", m, "--skill", "auto", "--ids", ids_s, "-o", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("skill auto: '%s'" % kid, r.stderr)
            auto = np.load(out)
            r = subprocess.run([DORY, "logits", "-m", m, "--skill", kid, "--ids", ids_s, "-o", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(np.array_equal(auto, np.load(out)), kid)
            r = subprocess.run([DORY, "skill", "route", "-m", m, "--ids", ids_s], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("route: %s" % kid, r.stdout)
            p = phi(ids)
            for other in kinds:
                got = float(re.search(r"^%s +E ([\d.e+-]+)$" % other, r.stdout, re.M).group(1))
                want = numpy_e(other, p)
                self.assertAlmostEqual(got, want, delta=1e-4 * abs(want) + 1e-6, msg=(other, r.stdout))
        r = subprocess.run([DORY, "skill", "list", "-m", m], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"low +- \| 1 tensors \| layers \[\d+\] \| router: mse, phi layer %d, rank 2"
                         % phi_layer)
        # Broken router descriptors: one line each, at load.
        for sel, msg in (({"metric": "cosine"}, "metric 'cosine'"), ({"mean": "@@@@"}, "not base64"),
                         ({"rank": 3}, "basis has"), ({"phi_layer": L + 5}, "phi_layer")):
            bad = json.loads(json.dumps(skills))
            bad[0]["selection"].update(sel)
            W.write(m, base + entries, arch=self.arch(), quant_type="BF16", extra_header={"skills": bad})
            r = subprocess.run([DORY, "logits", "-m", m, "--skill", "auto", "--ids", "11,12,13", "-o", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, (sel, r.stderr))
            self.assertIn(msg, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = subprocess.run([DORY, "ppl", "-m", m, "--skill", "auto", "-f", "/usr/share/common-licenses/GPL-3"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--skill auto routes one prompt", r.stderr)

    def test_skill_add_grafts_a_fine_tune_and_routes_to_it(self):
        """dory skill add: the tensors of a same-shaped fine-tune that differ from the base go
        in as skill.ID.* (bf16), with a router fitted from prompts of its kind; the new file
        runs the fine-tune's logits exactly under --skill ID, the base's without, and --skill
        auto picks the skill whose prompts a request resembles."""
        d = os.path.join(self.tmp, "add")
        base, _ = self.write_cmf(d, q8_2f=False)
        mlps = [i for i, ch in enumerate(self.config["hybrid_layer_pattern"]) if ch == "-"]
        rng = np.random.default_rng(9)
        fts, files = {}, {}
        for n, (kid, factor) in enumerate((("low", -1.5), ("high", 0.5))):
            target = "backbone.layers.%d.mixer.up_proj.weight" % mlps[n]
            entries = []
            for name, (dt, shape, raw) in sorted(self.tensors.items()):
                if name == target:
                    ch = (bf16_to_f32(raw) * factor).astype(np.float32)
                    raw = (ch.view(np.uint32) >> 16).astype(np.uint16).tobytes()
                entries.append((name, W.BF16, tuple(shape), raw))
            fd = os.path.join(d, "ft_" + kid)
            os.makedirs(fd, exist_ok=True)
            shutil.copy(os.path.join(self.src, "config.json"), fd)
            fts[kid] = os.path.join(fd, "m.cmf")
            W.write(fts[kid], entries, arch=self.arch(), quant_type="BF16")
            lo = 10 if kid == "low" else 200
            files[kid] = os.path.join(d, kid + ".ids")
            with open(files[kid], "w") as f:
                for _ in range(5):
                    f.write(",".join(str(int(i)) for i in rng.integers(lo, lo + 10, 32)) + "\n")
        one, two = os.path.join(d, "one.cmf"), os.path.join(d, "two.cmf")
        for src, kid, out in ((base, "low", one), (one, "high", two)):
            r = subprocess.run([DORY, "skill", "add", "-m", src, "--from", fts[kid], "--id", kid, "--prompt-ids",
                                files[kid], "--rank", "2", "-o", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stderr, r"skill %s: 1 tensors .* layers \[%d\]; router from 5 prompts" % (kid, mlps[0 if kid == "low" else 1]))
        r = subprocess.run([DORY, "skill", "list", "-m", two], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"low +- \| 1 tensors .*router: mse, phi layer \d+, rank 2")
        self.assertRegex(r.stdout, r"high +- \| 1 tensors .*router: mse, phi layer \d+, rank 2")
        out = os.path.join(self.tmp, "a.npy")

        def lg(model, *flags, ids=None):
            r = subprocess.run([DORY, "logits", "-m", model, "--ids", ids or self.ids, "-o", out, *flags],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            return np.load(out), r.stderr
        for kid in ("low", "high"):
            self.assertTrue(np.array_equal(lg(two, "--skill", kid)[0], lg(fts[kid])[0]), kid)
        self.assertTrue(np.array_equal(lg(two)[0], lg(base)[0]))
        for kid, lo in (("low", 10), ("high", 200)):
            ids = ",".join(str(int(i)) for i in rng.integers(lo, lo + 10, 32))
            got, err = lg(two, "--skill", "auto", ids=ids)
            self.assertIn("skill auto: '%s'" % kid, err)
        for args, msg in ((["--from", fts["low"], "--id", "low"], "has a skill 'low' already"),
                          (["--from", base, "--id", "same"], "no tensor differs"),
                          (["--from", fts["low"], "--id", "bad id"], "a skill id is"),
                          (["--from", fts["low"], "--id", "x", "--prompt-ids", "/nonexistent"], "cannot open")):
            if "--prompt-ids" not in args:
                args = args + ["--prompt-ids", files["low"]]
            r = subprocess.run([DORY, "skill", "add", "-m", two, *args, "-o", os.path.join(d, "x.cmf")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, (args, r.stderr))
            self.assertIn(msg, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "x.cmf")))

    def test_arch_and_config_json_must_agree(self):
        path, _ = self.write_cmf(os.path.join(self.tmp, "bad"), q8_2f=False)
        c = dict(self.config)
        c["hidden_size"] = c["hidden_size"] * 2
        json.dump(c, open(os.path.join(self.tmp, "bad", "config.json"), "w"))
        r = subprocess.run([DORY, "logits", "-m", path, "--ids", "1,2", "-o", os.path.join(self.tmp, "x.npy")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("hidden_size", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)


class ConvertRoundTrips(unittest.TestCase):
    """dory convert to CMF and back: HF -> CMF (bf16) keeps the logits bit for bit and runs with
    the file's own tokenizer; CMF -> GGUF Q8_0 equals HF -> GGUF Q8_0; a q8_2f file written by
    dory decodes, in numpy (cmf_writer's decoder, written from docs/cmf.md), to what dory reads."""

    @classmethod
    def setUpClass(cls):
        if not DORY or not os.access(DORY, os.X_OK):
            raise RuntimeError("DORY_BIN must name the dory binary")
        cls.tmp = tempfile.mkdtemp(prefix="dory_cmfc_")
        cls.mini = os.path.join(ROOT, "models", "dory-mini")
        cls.ids = "1,50,300,2000,17,99,1000,5,4095"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_ok(self, *args):
        r = subprocess.run([DORY, *args], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, (args, r.stderr))
        return r

    def logits(self, model):
        out = os.path.join(self.tmp, "l.npy")
        self.run_ok("logits", "-m", model, "--ids", self.ids, "-o", out, "-t", "2")
        return np.load(out)

    def test_hf_cmf_gguf(self):
        cmf = os.path.join(self.tmp, "mini.cmf")
        self.run_ok("convert", self.mini, cmf, "-q")
        self.assertIn("0 mismatched", self.run_ok("verify", cmf).stdout)
        self.assertTrue(np.array_equal(self.logits(cmf), self.logits(self.mini)))
        a = self.run_ok("run", "-m", cmf, "-p", "The king said", "-n", "12", "-s", "3").stdout
        b = self.run_ok("run", "-m", self.mini, "-p", "The king said", "-n", "12", "-s", "3").stdout
        self.assertEqual(a, b)
        g1, g2 = os.path.join(self.tmp, "a.gguf"), os.path.join(self.tmp, "b.gguf")
        self.run_ok("quantize", cmf, g1, "--type", "q8_0", "-q")
        self.run_ok("quantize", self.mini, g2, "--type", "q8_0", "-q")
        self.assertTrue(np.array_equal(self.logits(g1), self.logits(g2)))

    def test_q8_2f_written_by_dory_decodes_in_numpy(self):
        cmf = os.path.join(self.tmp, "mini-q82.cmf")
        self.run_ok("convert", self.mini, cmf, "--type", "q8_2f", "-q")
        name = "backbone.layers.1.mixer.up_proj.weight"
        out = os.path.join(self.tmp, "t.npy")
        self.run_ok("info", "-m", cmf, "--dump", name, "-o", out)
        data = open(cmf, "rb").read()
        doff, data_off = struct.unpack_from("<Q", data, 0x20)[0], struct.unpack_from("<Q", data, 0x30)[0]
        count, pool = struct.unpack_from("<QQ", data, doff)
        for i in range(count):
            no, nl, dt, nd = struct.unpack_from("<IHBB", data, doff + 16 + 56 * i)
            if data[doff + pool + no:doff + pool + no + nl].decode() != name:
                continue
            shape = struct.unpack_from("<%dI" % nd, data, doff + 16 + 56 * i + 8)
            off, nb = struct.unpack_from("<QQ", data, doff + 16 + 56 * i + 32)
            self.assertEqual(dt, W.Q8_2F)
            ref = W.dec_q8_2f(data[data_off + off:data_off + off + nb], *shape)
            self.assertTrue(np.array_equal(np.load(out), ref))
            break
        else:
            self.fail(name + " not in the directory")
        # and the model it makes is the model, to quantization error: against an F32 checkpoint
        # of exactly these decoded weights (so only the kernels' int8 inputs differ), and
        # against the bf16 original (the weights' quantization too).
        ref = os.path.join(self.tmp, "q82-f32")
        os.makedirs(ref, exist_ok=True)
        shutil.copy(os.path.join(self.mini, "config.json"), ref)
        tensors = {}
        count = struct.unpack_from("<Q", data, doff)[0]
        for i in range(count):
            no, nl = struct.unpack_from("<IH", data, doff + 16 + 56 * i)
            tname = data[doff + pool + no:doff + pool + no + nl].decode()
            p = os.path.join(self.tmp, "x.npy")
            self.run_ok("info", "-m", cmf, "--dump", tname, "-o", p)
            tensors[tname] = np.load(p)
        write_safetensors(os.path.join(ref, "model.safetensors"), tensors)
        got, exact, orig = self.logits(cmf), self.logits(ref), self.logits(self.mini)
        # (int8 inputs: max |d| measured 0.19 with the avx2 kernels, 0.20 with avx512's)
        for other, tol in ((exact, 0.3), (orig, 0.5)):
            self.assertTrue((got.argmax(1) == other.argmax(1)).all())
            self.assertLess(np.abs(got - other).max(), tol)


class FromGguf(unittest.TestCase):
    def test_gguf_input_gets_hugging_face_names(self):
        tmp = tempfile.mkdtemp(prefix="dory_cmfg_")
        try:
            mini = os.path.join(ROOT, "models", "dory-mini")
            g, c = os.path.join(tmp, "m.gguf"), os.path.join(tmp, "m.cmf")
            for args in (("quantize", mini, g, "--type", "q8_0", "-q"), ("convert", g, c, "--type", "f32", "-q")):
                r = subprocess.run([DORY, *args], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
            out = subprocess.run([DORY, "info", "-m", c, "--dump", "backbone.layers.0.attn_alpha", "-o",
                                  os.path.join(tmp, "a.npy")], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            lg = []
            for m in (g, c):
                p = os.path.join(tmp, "l.npy")
                r = subprocess.run([DORY, "logits", "-m", m, "--ids", "1,50,300,2000", "-o", p],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                lg.append(np.load(p))
            # The same weights (Q8_0 decoded exactly to f32); only the Q8_0 kernels' int8 inputs differ.
            self.assertTrue((lg[0].argmax(1) == lg[1].argmax(1)).all())
            self.assertLess(np.abs(lg[0] - lg[1]).max(), 0.2)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class GroupDtypes(unittest.TestCase):
    """cortiq's group dtypes (q4tp, q2tp, q4_tiled, q4_block, q8_row), written by the numpy
    writer into the built-in model, run on the Q4_0 / Q8_0 kernels (the loader repacks them;
    q4tp's and q2tp's f32 ladder rungs become f16 block scales): logits close to an F32
    checkpoint of numpy's exact decoding of the same bytes, and `dory info` says so."""

    def test_group_dtypes_run_as_their_decoding(self):
        tmp = tempfile.mkdtemp(prefix="dory_cmfq_")
        try:
            mini = os.path.join(ROOT, "models", "dory-mini")
            with open(os.path.join(mini, "config.json")) as f:
                cfg = json.load(f)
            arch = {"arch_name": "dory", "hidden_size": cfg["hidden_size"],
                    "intermediate_size": cfg["intermediate_size"], "num_layers": cfg["num_hidden_layers"],
                    "num_attention_heads": cfg["num_attention_heads"], "num_kv_heads": cfg["num_key_value_heads"],
                    "head_dim": cfg["attention_head_dim"], "vocab_size": cfg["vocab_size"]}
            tensors = read_safetensors(os.path.join(mini, "model.safetensors"))
            kinds = [(W.Q4TP, lambda w: W.enc_tp(w, 4), lambda b, r, c: W.dec_tp(b, r, c, 4)),
                     (W.Q4_TILED, W.enc_q4_tiled, W.dec_q4_tiled),
                     (W.Q8_ROW, W.enc_q8_row, W.dec_q8_row),
                     (W.Q4_BLOCK, W.enc_q4_block, lambda b, r, c: W.dec_q4_block(b, r * c).reshape(r, c))]
            entries, decoded, used = [], {}, set()
            mats = [n for n, (_, shape, _) in sorted(tensors.items()) if len(shape) == 2 and "embeddings" not in n]
            for name, (dt, shape, raw) in sorted(tensors.items()):
                w = ST.to_f32(dt, shape, raw).reshape(shape)
                if name in mats:
                    k = mats.index(name)
                    # one matrix as q2tp (2 bits: a rough model, but its own decoding is exact)
                    if k == 3:
                        code, enc, dec = W.Q2TP, (lambda w: W.enc_tp(w, 2)), (lambda b, r, c: W.dec_tp(b, r, c, 2))
                    else:
                        code, enc, dec = kinds[k % len(kinds)]
                    payload = enc(w)
                    entries.append((name, code, tuple(shape), payload))
                    decoded[name] = dec(payload, *shape)
                    used.add(code)
                else:
                    entries.append((name, W.F32, tuple(shape), w.astype(np.float32).tobytes()))
                    decoded[name] = w
            self.assertEqual(used, {W.Q4TP, W.Q2TP, W.Q4_TILED, W.Q8_ROW, W.Q4_BLOCK})
            d = os.path.join(tmp, "cmf")
            os.makedirs(d)
            shutil.copy(os.path.join(mini, "config.json"), d)
            path = os.path.join(d, "model.cmf")
            W.write(path, entries, arch=arch, quant_type="Q4TP")
            ref = os.path.join(tmp, "f32")
            os.makedirs(ref)
            shutil.copy(os.path.join(mini, "config.json"), ref)
            write_safetensors(os.path.join(ref, "model.safetensors"), decoded)

            def run(*args):
                r = subprocess.run([DORY, *args], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, (args, r.stderr))
                return r

            # the loader's reading of each dtype is numpy's (the ladder in f32, in turn)
            for name, code, shape, payload in entries:
                if code in (W.Q4TP, W.Q2TP):
                    out = os.path.join(tmp, "t.npy")
                    run("info", "-m", path, "--dump", name, "-o", out)
                    np.testing.assert_allclose(np.load(out).reshape(shape), decoded[name], rtol=1e-6, atol=1e-9,
                                               err_msg=name)
            info = run("info", "-m", path).stdout
            self.assertRegex(info, r"q4tp .*runs as Q4_0 blocks")
            self.assertRegex(info, r"q8_row .*runs as Q8_0 blocks")
            ids = "1,50,300,2000,17,99,1000,5,4095,7,8,900"
            got, exact = os.path.join(tmp, "g.npy"), os.path.join(tmp, "e.npy")
            run("logits", "-m", path, "--ids", ids, "-o", got, "-t", "2")
            run("logits", "-m", ref, "--ids", ids, "-o", exact, "-t", "2")
            got, exact = np.load(got), np.load(exact)
            # The blocks' int8 inputs and the rungs' f16 rounding (<= 2^-11 of a scale) against
            # float products of the same weights: the error grows with the logits, so the bound
            # is 1.5% of the largest |logit| (the 2026-12-07 model: 0.227 of 21.1, 1.1%; the
            # one before met 0.2 of ~20).
            self.assertTrue((got.argmax(1) == exact.argmax(1)).all())
            scale = np.abs(exact).max()
            print("group dtypes: max |logit - exact| %.4f, max |logit| %.2f" % (np.abs(got - exact).max(), scale),
                  file=sys.stderr)
            self.assertLess(np.abs(got - exact).max(), 0.015 * scale)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class SkillDynamic(unittest.TestCase):
    """--skill-dynamic (cortiq's --route-dynamic): the built-in model as CMF with two skills
    that each change one MLP layer after the routers' phi_layer, added by dory skill add from
    fine-tunes with routers fitted on prompts. With the thresholds pinned through the
    environment: never on gives the base model's text exactly (reading phi changes nothing);
    on and never off gives exactly the prompt's skill's text; off at every look switches at
    tokens 8, 16, ... and the text changes with it."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dory_cmfd_")
        mini = os.path.join(ROOT, "models", "dory-mini")
        with open(os.path.join(mini, "config.json")) as f:
            cfg = json.load(f)
        base = os.path.join(cls.tmp, "base.cmf")
        subprocess.run([DORY, "convert", mini, base, "-q"], check=True, capture_output=True)
        L = cfg["num_hidden_layers"]
        mlps = [i for i, ch in enumerate(cfg["hybrid_layer_pattern"]) if ch == "-" and i > (2 * L) // 3]
        tensors = read_safetensors(os.path.join(mini, "model.safetensors"))
        prompts = {"legal": ["The licence grants you the right to copy and to modify the program.",
                             "You may convey verbatim copies of the source code as you receive it.",
                             "This License applies to any program or other work which contains a notice."],
                   "sums": ["What is 4821 + 397? The answer is 5218.", "What is 12 + 30? The answer is 42.",
                            "What is 700 + 99? The answer is 799."]}
        src = base
        for n, (kid, lines) in enumerate(prompts.items()):
            ft = os.path.join(cls.tmp, "ft_" + kid)
            os.makedirs(ft)
            for f in os.listdir(mini):
                if f.endswith(".json") or f.endswith(".txt"):
                    shutil.copy(os.path.join(mini, f), ft)
            target = "backbone.layers.%d.mixer.up_proj.weight" % mlps[n]
            ts = {name: ST.to_f32(dt, shape, raw).reshape(shape) for name, (dt, shape, raw) in tensors.items()}
            ts[target] = ts[target] * (-1.5 if n == 0 else -2.0)
            write_safetensors(os.path.join(ft, "model.safetensors"), ts)
            pf = os.path.join(cls.tmp, kid + ".txt")
            with open(pf, "w") as f:
                f.write("\n".join(lines) + "\n")
            out = os.path.join(cls.tmp, "with_%s.cmf" % kid)
            r = subprocess.run([DORY, "skill", "add", "-m", src, "--from", ft, "--id", kid, "--prompts", pf,
                                "--rank", "2", "-o", out], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            src = out
        cls.model = src

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_dory(self, *args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([DORY, "run", "-m", self.model, "-p", "What is 31 + 8? The answer is", "-n", "24",
                               "--temp", "0", "--ignore-eos", "-t", "2", *args], capture_output=True, text=True, env=e)

    def test_skill_follows_the_text(self):
        never = self.run_dory("--skill-dynamic", env={"DORY_SKILL_ON": "-1"})
        self.assertEqual(never.returncode, 0, never.stderr)
        self.assertIn("skill dynamic: prompt: none -> none", never.stderr)
        self.assertEqual(never.stdout, self.run_dory("--skill", "none").stdout)
        pinned = self.run_dory("--skill-dynamic", env={"DORY_SKILL_ON": "10", "DORY_SKILL_OFF": "20",
                                                       "DORY_SKILL_MARGIN": "100"})
        self.assertEqual(pinned.returncode, 0, pinned.stderr)
        m = re.search(r"skill dynamic: prompt: none -> '(\w+)'", pinned.stderr)
        self.assertIsNotNone(m, pinned.stderr)
        first = m.group(1)
        self.assertNotIn("token 8", pinned.stderr)
        same = self.run_dory("--skill", first)
        self.assertEqual(pinned.stdout, same.stdout)
        flip = self.run_dory("--skill-dynamic", env={"DORY_SKILL_ON": "10", "DORY_SKILL_OFF": "-1"})
        self.assertEqual(flip.returncode, 0, flip.stderr)
        self.assertRegex(flip.stderr, r"skill dynamic: token 8: '%s' -> (none|'\w+')" % first)
        self.assertRegex(flip.stderr, r"skill dynamic: token 16: ")
        self.assertNotEqual(flip.stdout, same.stdout)

    def test_server_requests_follow_the_text(self):
        """dory serve: "skill": "dynamic" in a request (or --skill-dynamic for every request)
        gives the text dory run --skill-dynamic gives with the same thresholds, switches
        included, and leaves the slot to the next request as it found it."""
        sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
        from serverlib import Server, post_json  # noqa: E402
        prompt = "What is 31 + 8? The answer is"

        def ask(srv, **extra):
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            body.update(extra)
            status, out = post_json(srv.port, "/v1/completions", body)
            self.assertEqual(status, 200, out)
            return out["choices"][0]["text"]

        flip_env = {"DORY_SKILL_ON": "10", "DORY_SKILL_OFF": "-1"}
        pinned_env = {"DORY_SKILL_ON": "10", "DORY_SKILL_OFF": "20", "DORY_SKILL_MARGIN": "100"}
        flip = Server(DORY, self.model, "-t", "2", "--parallel", "2", env=flip_env)
        try:
            base = ask(flip)
            # dory run ends its text with a newline; the server's is the text alone
            self.assertEqual(base + "\n", self.run_dory("--skill", "none").stdout)
            want = self.run_dory("--skill-dynamic", env=flip_env)
            self.assertEqual(ask(flip, skill="dynamic") + "\n", want.stdout)
            self.assertIn("dory serve: skill dynamic: token 16: ", flip.stderr())
            self.assertEqual(ask(flip), base)  # the slot is the base model's again
            self.assertEqual(ask(flip, skill="dynamic") + "\n", want.stdout)
            # Four at once on two slots, dynamic and plain mixed: each answer as alone.
            import threading
            got = {}

            def go(k):
                got[k] = ask(flip, **({"skill": "dynamic"} if k % 2 else {}))
            threads = [threading.Thread(target=go, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual([got[k] for k in range(4)], [base, want.stdout[:-1]] * 2)
        finally:
            self.assertEqual(flip.stop(), 0, flip.stderr())
        pinned = Server(DORY, self.model, "-t", "2", "--parallel", "1", "--skill-dynamic", env=pinned_env)
        try:
            m = re.search(r"prompt: none -> '(\w+)'", self.run_dory("--skill-dynamic", env=pinned_env).stderr)
            self.assertIsNotNone(m)
            self.assertEqual(ask(pinned) + "\n", self.run_dory("--skill", m.group(1)).stdout)
            self.assertEqual(ask(pinned, skill="none"), base)
        finally:
            self.assertEqual(pinned.stop(), 0, pinned.stderr())

    def test_bad_uses_are_one_line_errors(self):
        mini = os.path.join(ROOT, "models", "dory-mini")
        for args, msg in ((["--skill-dynamic", "--skill", "legal"], "leave out --skill legal"),
                          (["--skill-dynamic", "--kv", "last_loop", "--gate", "conf:0.5"], "needs --gate off")):
            r = self.run_dory(*args)
            self.assertEqual(r.returncode, 1, (args, r.stderr))
            self.assertIn(msg, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = subprocess.run([DORY, "run", "-m", mini, "-p", "hi", "-n", "2", "--skill-dynamic"], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("skills live in CMF files", r.stderr)
        r = subprocess.run([DORY, "ppl", "-m", self.model, "--skill-dynamic", "-f", os.path.join(ROOT, "README.md")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--skill-dynamic follows generated text", r.stderr)
        # dory serve: a flag the server cannot honour stops it at start-up with one line (after
        # the "listening" one); a request asking for what it cannot do is a 400.
        for model, args, msg in ((mini, [], "skills live in CMF files"),
                                 (self.model, ["--kv", "last_loop", "--gate", "conf:0.5"], "needs --gate off"),
                                 (self.model, ["--skill", "legal"], "leave out --skill legal")):
            r = subprocess.run([DORY, "serve", "-m", model, "--port", "0", "--skill-dynamic", *args],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, (args, r.stderr))
            self.assertIn(msg, r.stderr.strip().splitlines()[-1])
        sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
        from serverlib import Server, post_json  # noqa: E402
        for model, args, msg in ((mini, [], "'dynamic': skills live in CMF files"),
                                 (self.model, ["--kv", "last_loop", "--gate", "conf:0.5"], "needs --gate off")):
            srv = Server(DORY, model, "-t", "1", "--parallel", "1", *args)
            try:
                status, out = post_json(srv.port, "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                                       "skill": "dynamic"})
                self.assertEqual(status, 400, out)
                self.assertIn(msg, out["error"]["message"])
                self.assertNotIn("\n", out["error"]["message"])
            finally:
                self.assertEqual(srv.stop(), 0, srv.stderr())


if __name__ == "__main__":
    unittest.main()
