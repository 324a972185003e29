#!/usr/bin/python3
"""Parity of the C++ engine against the float64 numpy reference.

Run (Debian's python, which has numpy):
    DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/parity -v
    DORY_BIN=build/dory /usr/bin/python3 tests/parity/test_parity.py -v

Every engine test FAILS when DORY_BIN is unset or not an executable: a parity test
that silently skips proves nothing. `ReferenceSanity` checks the reference itself and
needs no engine.

Environment:
    DORY_BIN       path of the `dory` binary (required for the engine tests)
    DORY_THREADS   -t for the engine (default 2)
    DORY_KEEP_TMP  keep the generated checkpoints (prints where)
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_CHECKPOINT = os.path.join(ROOT, "scripts", "make_checkpoint.py")
sys.dont_write_bytecode = True  # keep scripts/ free of __pycache__
sys.path.insert(0, os.path.join(ROOT, "scripts", "reference"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import dory_ref  # noqa: E402

# f32 engine against the f64 reference, logits of magnitude ~5-8 after 12 layers and a
# few loops: measured f32 rounding drift is ~1e-4, so 1e-3 leaves a 10x margin while any
# real bug (wrong scale, wrong window, wrong cache slot) moves logits by >= 1e-2.
TOL = 1e-3
# Two runs of the same binary on the same weights (sharded vs single file) must agree
# to float noise: the weights are bit-identical.
SAME_WEIGHTS_TOL = 1e-6
# A case that is supposed to change the numbers must move them by at least this much,
# or the test comparing it would mean nothing.
MUST_DIFFER = 0.05
# 16 loops: this random model's loop map is mildly expanding (x1.4 per loop), so a 1e-7
# relative nudge of the embeddings already moves 16-loop logits by 2.6e-3 in float64, and
# a float32 emulation of the reference drifts by 1.6e-3. A tolerance of 1e-2 still catches
# every real bug (a wrong cache slot or loop index moves logits by O(1)).
TOL_DEEP = 1e-2

N_IDS = 20
THREADS = int(os.environ.get("DORY_THREADS", "2"))

_TMP = tempfile.mkdtemp(prefix="dory_parity_")
_CKPTS = {}


def _cleanup():
    if os.environ.get("DORY_KEEP_TMP"):
        print("parity checkpoints kept in %s" % _TMP, file=sys.stderr)
    else:
        shutil.rmtree(_TMP, ignore_errors=True)


atexit.register(_cleanup)


def checkpoint(*sets, dtype="bf16", shards=1, seed=0, drop=()):
    """Directory of a tiny checkpoint with config overrides `sets` ("key=JSON"), cached."""
    key = (tuple(sets), dtype, shards, seed, tuple(drop))
    if key not in _CKPTS:
        out = os.path.join(_TMP, "ckpt%02d" % len(_CKPTS))
        cmd = [sys.executable, MAKE_CHECKPOINT, "--out", out, "--preset", "tiny",
               "--dtype", dtype, "--shards", str(shards), "--seed", str(seed), "--quiet"]
        for s in sets:
            cmd += ["--set", s]
        for d in drop:
            cmd += ["--drop", d]
        subprocess.run(cmd, check=True)
        _CKPTS[key] = out
    return _CKPTS[key]


def gate_init_dropped():
    """The g0=3.0 checkpoint's weights with g0 left out of config.json (-> sqrt(H))."""
    out = os.path.join(_TMP, "g0-dropped")
    if not os.path.isdir(out):
        shutil.copytree(checkpoint("attention_output_gate_logit_scale_init=3.0"), out)
        c = config(out)
        del c["attention_output_gate_logit_scale_init"]
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
    return out


def config(model):
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)


def token_ids(model, n=N_IDS, seed=1234):
    """n random in-range ids, fixed seed."""
    V = config(model)["vocab_size"]
    return [int(i) for i in np.random.default_rng(seed).integers(0, V, n)]


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


class EngineCase(unittest.TestCase):
    """Helpers to run the engine and compare it with the reference."""

    def engine(self, model, ids, loops=None, kv=None, chunk=None, threads=THREADS):
        binary = os.environ.get("DORY_BIN")
        if not binary:
            self.fail("DORY_BIN is not set: point it at the built `dory` binary, e.g. "
                      "DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/parity")
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            self.fail("DORY_BIN=%s is not an executable file" % binary)
        fd, out = tempfile.mkstemp(suffix=".npy", dir=_TMP)
        os.close(fd)
        cmd = [binary, "logits", "-m", model, "--ids", ",".join(map(str, ids)),
               "-t", str(threads), "-o", out]
        if loops is not None:
            cmd += ["--loops", str(loops)]
        if kv is not None:
            cmd += ["--kv", kv]
        if chunk is not None:
            cmd += ["--chunk", str(chunk)]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        if r.returncode != 0:
            self.fail("engine failed (rc %d): %s\nstdout: %s\nstderr: %s"
                      % (r.returncode, " ".join(cmd), r.stdout.decode(errors="replace")[-2000:],
                         r.stderr.decode(errors="replace")[-2000:]))
        got = np.load(out)
        os.remove(out)
        V = config(model)["vocab_size"]
        self.assertEqual(got.dtype, np.dtype("<f4"), "engine .npy must be little-endian float32")
        self.assertEqual(got.shape, (len(ids), V), "engine .npy must be [n_ids, V]")
        self.assertTrue(np.isfinite(got).all(), "engine logits hold NaN/inf")
        return got

    def run_engine_raw(self, model, ids, extra=()):
        """Run `dory logits` with extra flags; returns the CompletedProcess."""
        binary = os.environ.get("DORY_BIN")
        if not binary or not os.access(binary, os.X_OK):
            self.fail("DORY_BIN is not set or not executable (%r)" % binary)
        cmd = [binary, "logits", "-m", model, "--ids", ",".join(map(str, ids)),
               "-t", str(THREADS), "-o", os.path.join(_TMP, "unused.npy")] + list(extra)
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)

    def assertParity(self, got, ref, what, tol=TOL):
        err = maxdiff(got, ref)
        print("  %-58s max|logit| %6.3f  max|d| %.2e" % (what, float(np.abs(ref).max()), err))
        # f32 engine vs f64 reference: see TOL (and TOL_DEEP) above.
        self.assertLessEqual(err, tol, "%s: engine differs from the reference by %.3e (tol %g)"
                             % (what, err, tol))

    def assertDiffer(self, a, b, what):
        d = maxdiff(a, b)
        self.assertGreater(d, MUST_DIFFER, "%s: expected a real difference, got %.3e" % (what, d))

    def check(self, model, ids=None, loops=None, kv=None, chunk=None, what="", tol=TOL, **ref_kw):
        """Engine vs reference on the same chunk schedule; returns (engine, reference)."""
        ids = token_ids(model) if ids is None else ids
        got = self.engine(model, ids, loops=loops, kv=kv, chunk=chunk)
        # The engine's default chunk is 64 rows.
        ref = dory_ref.run(model, ids, loops=loops, kv=kv, chunk=64 if chunk is None else chunk,
                           **ref_kw)
        self.assertParity(got, ref, what or "loops=%s kv=%s chunk=%s" % (loops, kv, chunk), tol)
        return got, ref


class ParityChunks(EngineCase):
    def test_per_loop_chunks(self):
        m = checkpoint()
        ids = token_ids(m)
        ref = dory_ref.run(m, ids, kv="per_loop")  # one chunk; per_loop ignores chunking
        for chunk in (1, 3, 8, 64):
            with self.subTest(chunk=chunk):
                got = self.engine(m, ids, kv="per_loop", chunk=chunk)
                self.assertParity(got, ref, "per_loop chunk=%d vs one-chunk reference" % chunk)

    def test_last_loop_chunks(self):
        m = checkpoint()
        ids = token_ids(m)
        per = dory_ref.run(m, ids, kv="per_loop")
        for chunk in (1, 3, 8):
            with self.subTest(chunk=chunk):
                got, ref = self.check(m, ids, kv="last_loop", chunk=chunk,
                                      what="last_loop chunk=%d (same schedule)" % chunk)
                if chunk == 3:
                    # The case means something only if last_loop really differs here.
                    self.assertDiffer(ref, per, "reference last_loop chunk 3 vs per_loop")
                    self.assertDiffer(got, per, "engine last_loop chunk 3 vs per_loop")

    def test_default_chunk_64(self):
        m = checkpoint()
        ids = token_ids(m, n=70)  # 64 + 6 rows under the engine's default chunk
        self.check(m, ids, kv="per_loop", what="per_loop 70 ids, default chunk")
        self.check(m, ids, kv="last_loop", what="last_loop 70 ids, default chunk (64+6)")

    def test_prefix_is_causal(self):
        m = checkpoint()
        ids = token_ids(m)
        full = self.engine(m, ids, kv="last_loop", chunk=3)
        head = self.engine(m, ids[:9], kv="last_loop", chunk=3)
        err = maxdiff(full[:9], head)
        # Same chunks for the first 9 rows, so the same numbers up to thread noise.
        self.assertLessEqual(err, TOL, "rows 0..8 changed when later ids were appended")

    def test_threads(self):
        m = checkpoint()
        ids = token_ids(m)
        ref = dory_ref.run(m, ids, kv="per_loop")
        for t in (1, 3):
            with self.subTest(threads=t):
                got = self.engine(m, ids, kv="per_loop", chunk=8, threads=t)
                self.assertParity(got, ref, "per_loop chunk=8 threads=%d" % t)


class ParityLoops(EngineCase):
    def test_loops(self):
        m = checkpoint()
        base = config(m)["n_recurrent_loops"]
        self.assertEqual(base, 2)
        prev = None
        for loops in (1, 2, 4, base + 1):
            with self.subTest(loops=loops):
                got, ref = self.check(m, loops=loops, kv="per_loop", chunk=3,
                                      what="per_loop loops=%d chunk=3" % loops)
                if prev is not None:
                    self.assertDiffer(ref, prev, "reference loops=%d vs previous" % loops)
                prev = ref
        for loops in (1, 4):
            with self.subTest(loops=loops, kv="last_loop"):
                self.check(m, loops=loops, kv="last_loop", chunk=3,
                           what="last_loop loops=%d chunk=3" % loops)

    def test_loops_max_and_invalid(self):
        m = checkpoint()
        # Deep loops amplify f32 rounding: TOL_DEEP, see above.
        self.check(m, loops=16, kv="per_loop", chunk=8, what="per_loop loops=16 chunk=8",
                   tol=TOL_DEEP)
        self.check(m, loops=16, kv="last_loop", chunk=3, what="last_loop loops=16 chunk=3",
                   tol=TOL_DEEP)
        for bad in (0, 17):
            with self.subTest(loops=bad):
                r = self.run_engine_raw(m, token_ids(m), ["--loops", str(bad)])
                # Loop counts are 1..16 (docs/model.md section 1); a bad one is an error, not a crash.
                self.assertGreater(r.returncode, 0, "--loops %d was accepted (or crashed)" % bad)

    def test_loops_from_config(self):
        m = checkpoint("n_recurrent_loops=3")
        got, ref = self.check(m, kv="per_loop", what="no --loops, config n_recurrent_loops=3")
        self.assertDiffer(ref, dory_ref.run(m, token_ids(m), loops=2), "loops 3 vs 2")

    def test_kv_mode_from_config(self):
        m = checkpoint('recurrent_kv_cache_mode="last_loop"')
        ids = token_ids(m)
        got = self.engine(m, ids, chunk=3)
        ref = dory_ref.run(m, ids, kv="last_loop", chunk=3)
        self.assertParity(got, ref, "no --kv, config recurrent_kv_cache_mode=last_loop")


class ParityShapes(EngineCase):
    def test_sliding_window_shorter_than_sequence(self):
        m = checkpoint()
        ids = token_ids(m)
        W = config(m)["swa_window_size"]
        self.assertLess(W, len(ids), "window must be shorter than the sequence")
        wide = checkpoint("swa_window_size=64")  # same weights (per-tensor seeds)
        for chunk in (1, 3):
            with self.subTest(chunk=chunk):
                _, ref = self.check(m, ids, kv="per_loop", chunk=chunk,
                                    what="W=%d < %d ids, chunk=%d" % (W, len(ids), chunk))
        _, ref_wide = self.check(wide, ids, kv="per_loop", chunk=3, what="W=64 >= ids")
        self.assertDiffer(ref, ref_wide, "window 4 vs 64")

    def test_mqa_and_mha(self):
        for nk in (1, 4):
            m = checkpoint("num_key_value_heads=%d" % nk)
            self.assertEqual(config(m)["num_attention_heads"], 4)
            for kv in ("per_loop", "last_loop"):
                with self.subTest(nk=nk, kv=kv):
                    self.check(m, kv=kv, chunk=3, what="nk=%d %s chunk=3" % (nk, kv))

    def test_gate_init(self):
        for g0 in ("null", "3.0"):
            m = checkpoint("attention_output_gate_logit_scale_init=%s" % g0)
            with self.subTest(g0=g0):
                self.check(m, kv="per_loop", chunk=3, what="g0=%s" % g0)
        # The generator sizes s_gate for the file's g0, so both files above behave alike.
        # To prove g0 is read, feed the g0=3.0 weights with g0 removed (-> sqrt(H)).
        m = gate_init_dropped()
        _, ref = self.check(m, kv="per_loop", chunk=3, what="g0=3.0 weights, g0 absent")
        self.assertDiffer(ref, dory_ref.run(checkpoint("attention_output_gate_logit_scale_init=3.0"),
                                            token_ids(m), kv="per_loop"), "g0 absent vs 3.0")

    def test_partial_rotary(self):
        cases = (("partial_rotary_factor_2=0.5",), ("partial_rotary_factor=0.5",))
        full = dory_ref.run(checkpoint(), token_ids(checkpoint()), kv="per_loop")
        for sets in cases:
            m = checkpoint(*sets)
            with self.subTest(sets=sets):
                _, ref = self.check(m, kv="per_loop", chunk=3, what=" ".join(sets))
                self.assertDiffer(ref, full, "%s vs full rotary" % (sets,))

    def test_odd_sizes(self):
        # Sizes that are not multiples of the SIMD widths: kernel tails must be right.
        m = checkpoint("hidden_size=72", "intermediate_size=100", "attention_head_dim=24",
                       "vocab_size=250")
        for kv in ("per_loop", "last_loop"):
            with self.subTest(kv=kv):
                self.check(m, kv=kv, chunk=3, what="H=72 F=100 hd=24 V=250 %s" % kv)

    def test_pattern_mlp_first(self):
        # Layer 0 an MLP: only there does an MLP see a raw (un-normalized) row, so only
        # this pattern catches an MLP that normalizes its input. Also S* back to back.
        m = checkpoint('hybrid_layer_pattern="-S-*S-*--S*-"')
        for kv in ("per_loop", "last_loop"):
            with self.subTest(kv=kv):
                self.check(m, kv=kv, chunk=3, what="pattern -S-*S-*--S*- %s chunk=3" % kv)

    def test_absent_optional_keys(self):
        # Defaults: rope_theta_2 -> rope_theta, profiles -> all 1, prf_2 -> prf, g0 -> sqrt(H).
        m = checkpoint(drop=("rope_theta_2", "rope_profile_layers", "partial_rotary_factor_2",
                             "attention_output_gate_logit_scale_init", "head_dim"))
        self.check(m, kv="per_loop", chunk=3, what="optional keys absent")


class ParityFiles(EngineCase):
    def test_dtypes(self):
        for dtype in ("bf16", "f16", "f32"):
            m = checkpoint(dtype=dtype)
            with self.subTest(dtype=dtype):
                self.check(m, kv="per_loop", chunk=3, what="%s checkpoint per_loop" % dtype)
                self.check(m, kv="last_loop", chunk=3, what="%s checkpoint last_loop" % dtype)

    def test_sharded(self):
        single, sharded = checkpoint(), checkpoint(shards=3)
        self.assertTrue(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
        self.assertTrue(os.path.exists(os.path.join(sharded, "model-00003-of-00003.safetensors")))
        ids = token_ids(single)
        a = self.engine(single, ids, kv="last_loop", chunk=3)
        b = self.engine(sharded, ids, kv="last_loop", chunk=3)
        err = maxdiff(a, b)
        # Bit-identical weights through the same binary: float noise at most.
        self.assertLessEqual(err, SAME_WEIGHTS_TOL, "sharded vs single file differ by %.3e" % err)
        self.assertParity(b, dory_ref.run(sharded, ids, kv="last_loop", chunk=3),
                          "sharded (3 files) last_loop chunk=3")


class EngineErrors(EngineCase):
    """Fixed-value config keys must be validated with an error naming the key (docs/model.md section 1)."""

    def test_fixed_keys_rejected(self):
        for sets, key in ((("ngpt=false",), "ngpt"),
                          (("fngpt=false",), "fngpt"),
                          (("ngpt_enable_final_norm=true",), "ngpt_enable_final_norm"),
                          (("attention_output_gate=false",), "attention_output_gate"),
                          (('mlp_hidden_act="gelu"',), "mlp_hidden_act"),
                          (("mlp_bias=true",), "mlp_bias"),
                          (("attention_bias=true",), "attention_bias"),
                          (('initial_state="zeros"',), "initial_state"),
                          (('input_transform="add"',), "input_transform"),
                          (('output_transform="add"',), "output_transform"),
                          (('mixer_type="mamba"',), "mixer_type"),
                          (("dory_format_version=2",), "dory_format_version"),
                          (("head_dim=8", "attention_head_dim=16"), "head_dim")):
            with self.subTest(key=key):
                m = checkpoint(*sets)
                r = self.run_engine_raw(m, [1, 2, 3])
                text = (r.stdout + r.stderr).decode(errors="replace")
                self.assertGreater(r.returncode, 0, "%s: engine accepted %s (or crashed)" % (key, sets))
                self.assertIn(key, text, "%s: the error should name the key; got: %s"
                              % (key, text[-500:]))


class ReferenceSanity(unittest.TestCase):
    """Checks of the reference and the checkpoint maker themselves (no engine)."""

    # Float64 on both sides, only summation order differs.
    EXACT = 1e-9

    def test_per_loop_independent_of_chunks(self):
        m = checkpoint()
        ids = token_ids(m)
        ref = dory_ref.run(m, ids, kv="per_loop")
        for sched in ([1] * N_IDS, dory_ref.chunk_sizes(N_IDS, 3), [5, 2, 13], [19, 1]):
            self.assertLessEqual(maxdiff(dory_ref.run(m, ids, kv="per_loop", chunks=sched), ref),
                                 self.EXACT, "per_loop changed with chunks %s" % sched)

    def test_last_loop(self):
        m = checkpoint()
        ids = token_ids(m)
        per = dory_ref.run(m, ids, kv="per_loop")
        # One chunk: every loop sees its own keys for all rows, exactly as per_loop.
        self.assertLessEqual(maxdiff(dory_ref.run(m, ids, kv="last_loop"), per), self.EXACT)
        # One loop: there is nothing to overwrite.
        self.assertLessEqual(maxdiff(dory_ref.run(m, ids, loops=1, kv="last_loop", chunk=3),
                                     dory_ref.run(m, ids, loops=1, kv="per_loop")), self.EXACT)
        for chunk in (1, 3, 8):
            self.assertGreater(maxdiff(dory_ref.run(m, ids, kv="last_loop", chunk=chunk), per),
                               MUST_DIFFER, "last_loop chunk %d should differ" % chunk)
        # Rows of the first chunk see no earlier rows, so they match per_loop.
        ll = dory_ref.run(m, ids, kv="last_loop", chunk=8)
        self.assertLessEqual(maxdiff(ll[:8], per[:8]), self.EXACT)

    def test_loops_per_chunk(self):
        m = checkpoint()
        ids = token_ids(m)
        same = dory_ref.run(m, ids, kv="last_loop", chunks=[6, 7, 7], loops_per_chunk=[2, 2, 2])
        self.assertLessEqual(maxdiff(same, dory_ref.run(m, ids, kv="last_loop", chunks=[6, 7, 7])),
                             self.EXACT)
        mixed = dory_ref.run(m, ids, kv="last_loop", chunks=[6, 7, 7], loops_per_chunk=[2, 1, 3])
        self.assertLessEqual(maxdiff(mixed[:6], same[:6]), self.EXACT)
        self.assertGreater(maxdiff(mixed[6:], same[6:]), MUST_DIFFER)
        with self.assertRaises(ValueError):
            dory_ref.run(m, ids, kv="per_loop", chunks=[10, 10], loops_per_chunk=[1, 2])

    def test_loops_change_output(self):
        m = checkpoint()
        ids = token_ids(m)
        outs = [dory_ref.run(m, ids, loops=k) for k in (1, 2, 3, 4)]
        for a, b in zip(outs, outs[1:]):
            self.assertGreater(maxdiff(a, b), MUST_DIFFER)
        self.assertLessEqual(maxdiff(outs[1], dory_ref.run(m, ids)), self.EXACT)  # default 2

    def test_causal(self):
        m = checkpoint()
        ids = token_ids(m)
        full = dory_ref.run(m, ids, kv="per_loop")
        self.assertLessEqual(maxdiff(dory_ref.run(m, ids[:7], kv="per_loop"), full[:7]), self.EXACT)

    def test_window(self):
        # S and * layers hold the same tensors and the generator seeds each tensor by its
        # name, so these three files share weights: an S layer with W >= n must equal a *.
        m4 = checkpoint()
        pattern = config(m4)["hybrid_layer_pattern"]
        profiles = json.dumps(config(m4)["rope_profile_layers"])
        m64 = checkpoint("swa_window_size=64")
        mfull = checkpoint('hybrid_layer_pattern="%s"' % pattern.replace("S", "*"),
                           "rope_profile_layers=%s" % profiles)
        ids = token_ids(m4)
        self.assertLess(config(m4)["swa_window_size"], len(ids))
        r4, r64, rfull = (dory_ref.run(d, ids, kv="last_loop", chunk=3) for d in (m4, m64, mfull))
        self.assertLessEqual(maxdiff(r64, rfull), self.EXACT)
        self.assertGreater(maxdiff(r4, r64), MUST_DIFFER)
        # Rows before position W see the same keys under any window.
        self.assertLessEqual(maxdiff(r4[:3], r64[:3]), self.EXACT)

    def test_magnitudes(self):
        m = checkpoint()
        ref = dory_ref.run(m, token_ids(m))
        top = float(np.abs(ref).max())
        self.assertTrue(3.0 < top < 15.0, "max |logit| %.2f should be ~5" % top)
        p = np.exp(ref - ref.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        self.assertTrue((p.max(axis=1) < 0.99).all(), "logits should not be one-hot")

    def test_files(self):
        single, sharded = checkpoint(), checkpoint(shards=3)
        ids = token_ids(single)
        self.assertEqual(maxdiff(dory_ref.run(single, ids), dory_ref.run(sharded, ids)), 0.0)
        with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(len(set(index["weight_map"].values())), 3)
        sizes = sum(os.path.getsize(os.path.join(sharded, fn)) for fn in set(index["weight_map"].values()))
        self.assertLess(index["metadata"]["total_size"], sizes)
        for dtype in ("f16", "f32"):
            d = maxdiff(dory_ref.run(checkpoint(dtype=dtype), ids), dory_ref.run(single, ids))
            self.assertGreater(d, 0.0, "%s file should not equal bf16 exactly" % dtype)
            self.assertLess(d, 2.0, "%s file should be close to bf16" % dtype)
        # Header: 8-byte length, padded JSON, tightly packed data.
        path = os.path.join(single, "model.safetensors")
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        self.assertEqual(n % 8, 0)
        self.assertEqual(header.pop("__metadata__"), {"format": "pt"})
        spans = sorted(tuple(v["data_offsets"]) for v in header.values())
        self.assertEqual(spans[0][0], 0)
        for (_, e), (b, _) in zip(spans, spans[1:]):
            self.assertEqual(e, b)
        self.assertEqual(8 + n + spans[-1][1], os.path.getsize(path))
        self.assertTrue(all(v["dtype"] == "BF16" for v in header.values()))

    def test_bf16_rounding(self):
        import make_checkpoint as mc
        x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5,
                      3.0e-3], dtype=np.float32)
        bits = mc.to_bf16_bits(x)
        back = (bits.astype(np.uint32) << 16).view(np.float32)
        want = [1.0, 1.0, 1 + 2 ** -6, 1 + 2 ** -7, -2.5]  # ties to even, above a tie rounds up
        self.assertEqual(back[:5].tolist(), want)
        self.assertLess(abs(back[5] - 3.0e-3), 3.0e-3 * 2 ** -8)

    def test_4b_dry_run(self):
        r = subprocess.run([sys.executable, MAKE_CHECKPOINT, "--preset", "4b", "--out",
                            os.path.join(_TMP, "4b-never-written"), "--dry-run"],
                           stdout=subprocess.PIPE, check=True)
        text = r.stdout.decode()
        self.assertIn("tensors: 507 ", text)
        self.assertIn("elements: 3975229440 ", text)
        self.assertIn("data bytes: 7950458880 ", text)
        self.assertFalse(os.path.exists(os.path.join(_TMP, "4b-never-written")))

    def test_config_keys(self):
        c = config(checkpoint())
        for key, want in (("model_type", "dory"), ("architectures", ["DoryForCausalLM"]),
                          ("dory_format_version", 1), ("ngpt", True), ("fngpt", True),
                          ("ngpt_enable_final_norm", False), ("attention_output_gate", True),
                          ("mlp_hidden_act", "silu"), ("mlp_bias", False),
                          ("attention_bias", False), ("initial_state", "input_copy"),
                          ("input_transform", "residual"), ("output_transform", "replace"),
                          ("mixer_type", None), ("tie_word_embeddings", False),
                          ("torch_dtype", "bfloat16")):
            self.assertEqual(c[key], want, key)
        self.assertEqual(c["head_dim"], c["attention_head_dim"])
        self.assertEqual(len(c["rope_profile_layers"]), c["num_hidden_layers"])
        self.assertEqual(set(c["rope_profile_layers"]), {1, 2})
        c = config(checkpoint("num_hidden_layers=16"))
        self.assertEqual(len(c["hybrid_layer_pattern"]), 16)
        self.assertEqual(len(c["rope_profile_layers"]), 16)
        self.assertEqual(c["n_input_layers"] + c["n_recurrent_layers"] + c["n_output_layers"], 16)


if __name__ == "__main__":
    unittest.main()
