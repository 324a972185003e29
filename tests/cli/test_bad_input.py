#!/usr/bin/python3
"""Bad input must give one clean error line, never a crash.

Run (Debian's python, which has numpy):
    DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/cli -v
    DORY_BIN=build/dory /usr/bin/python3 tests/cli/test_bad_input.py -v

Every case builds a fresh tiny checkpoint (a copy of one made once per run by
scripts/make_checkpoint.py), corrupts it in one specific way, runs the engine and
requires, for loader and input errors:
  * exit code exactly 1 (not 0, not a signal, not an abort/segfault code);
  * stderr exactly ONE line, starting with "error: ";
  * that line naming the file / key / tensor / id concerned and the problem;
  * no traceback or crash text ("Aborted", "terminate called", "Segmentation",
    "AddressSanitizer", ...) anywhere, and no .npy written.
Command-line parse errors (CLI11) only need a non-zero, non-crash exit code and a
message that names the option.

Every test FAILS (it does not skip) when DORY_BIN is unset or not executable.

Environment:
    DORY_BIN       path of the `dory` binary (required)
    DORY_KEEP_TMP  keep the generated checkpoints (prints where)
"""

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_CHECKPOINT = os.path.join(ROOT, "scripts", "make_checkpoint.py")
sys.dont_write_bytecode = True

TIMEOUT = 30  # seconds per engine run; a tiny model loads in milliseconds
CRASH_TEXT = ("Traceback", "Aborted", "abort", "terminate called", "Segmentation",
              "segfault", "core dumped", "AddressSanitizer", "UndefinedBehaviorSanitizer",
              "runtime error:", "LeakSanitizer", "Assertion", "assertion", "std::",
              "what():", "Illegal instruction", "Bus error", "Floating point exception")
CRASH_CODES = (134, 136, 137, 138, 139)  # 128 + SIGABRT/SIGFPE/SIGKILL/SIGBUS/SIGSEGV

# The tiny preset (scripts/make_checkpoint.py): H=64, vocab 256, 12 layers, "S-*-*-S-S-*-".
Q0 = "backbone.layers.0.mixer.q_proj.weight"
K0 = "backbone.layers.0.mixer.k_proj.weight"
V0 = "backbone.layers.0.mixer.v_proj.weight"
ALPHA0 = "backbone.layers.0.attn_alpha"
LOGIT_SCALE = "lm_head.logit_scale"

_TMP = tempfile.mkdtemp(prefix="dory_badinput_")
_BASE = {}
_SEQ = [0]


def _cleanup():
    if os.environ.get("DORY_KEEP_TMP"):
        print("bad-input checkpoints kept in %s" % _TMP, file=sys.stderr)
    else:
        shutil.rmtree(_TMP, ignore_errors=True)


atexit.register(_cleanup)


def _base(shards):
    """Pristine tiny bf16 checkpoint (made once per run); never modified."""
    if shards not in _BASE:
        out = os.path.join(_TMP, "base-%d" % shards)
        subprocess.run([sys.executable, MAKE_CHECKPOINT, "--out", out, "--preset", "tiny",
                        "--dtype", "bf16", "--shards", str(shards), "--seed", "0", "--quiet"],
                       check=True, timeout=120)
        _BASE[shards] = out
    return _BASE[shards]


def fresh(shards=1):
    """A fresh, private copy of the tiny checkpoint that a test may corrupt."""
    _SEQ[0] += 1
    out = os.path.join(_TMP, "case%03d" % _SEQ[0])
    shutil.copytree(_base(shards), out)
    return out


# ---------------------------------------------------------------------------
# safetensors editing


def st_read(path):
    """(header dict, raw data section bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode())
    return header, blob[8 + n:]


def st_write_raw(path, header_json_bytes, data, header_len=None):
    """Write length + (padded) header bytes + data; header_len overrides the length field."""
    js = header_json_bytes + b" " * ((-len(header_json_bytes)) % 8)
    n = len(js) if header_len is None else header_len
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little") + js + data)


def st_write(path, header, data):
    """Write a header dict (offsets as given, not recomputed) and a data section."""
    st_write_raw(path, json.dumps(header, separators=(",", ":")).encode(), data)


def st_tensors(path):
    """[(name, dtype, shape, bytes)] in data order, plus the metadata (or None)."""
    header, data = st_read(path)
    meta = header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = [(k, v["dtype"], list(v["shape"]),
            data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in items]
    return out, meta


def st_pack(path, tensors, meta=None):
    """Rewrite a consistent safetensors file from [(name, dtype, shape, bytes)]."""
    header = {} if meta is None else {"__metadata__": meta}
    off, chunks = 0, []
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        chunks.append(raw)
    st_write(path, header, b"".join(chunks))


def edit_header(path, fn):
    """Apply fn(header) to the header dict in place and rewrite (data unchanged)."""
    header, data = st_read(path)
    fn(header)
    st_write(path, header, data)


def edit_config(model, fn):
    p = os.path.join(model, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(p, "w") as f:
        json.dump(cfg, f, indent=2)


def edit_index(model, fn):
    p = os.path.join(model, "model.safetensors.index.json")
    with open(p) as f:
        idx = json.load(f)
    fn(idx)
    with open(p, "w") as f:
        json.dump(idx, f, indent=2)


def st_path(model):
    return os.path.join(model, "model.safetensors")


# ---------------------------------------------------------------------------


class CliCase(unittest.TestCase):
    maxDiff = None

    def binary(self):
        b = os.environ.get("DORY_BIN")
        if not b:
            self.fail("DORY_BIN is not set: point it at the built `dory` binary, e.g. "
                      "DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/cli")
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            self.fail("DORY_BIN=%s is not an executable file" % b)
        return b

    def run_dory(self, args):
        cmd = [self.binary()] + list(args)
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail("dory hung (> %d s): %s" % (TIMEOUT, " ".join(cmd)))
        r.cmd = " ".join(cmd)
        r.out = r.stdout.decode(errors="replace")
        r.err = r.stderr.decode(errors="replace")
        return r

    def logits(self, model, ids="1,2,3", extra=()):
        """Run `dory logits`; returns (CompletedProcess, output path)."""
        fd, out = tempfile.mkstemp(suffix=".npy", dir=_TMP)
        os.close(fd)
        os.remove(out)
        r = self.run_dory(["logits", "-m", model, "--ids", ids, "-t", "1", "-o", out]
                          + list(extra))
        return r, out

    def describe(self, r):
        return "\n  cmd: %s\n  rc: %s\n  stdout: %r\n  stderr: %r" % (
            r.cmd, r.returncode, r.out[-1500:], r.err[-1500:])

    def assertNoCrash(self, r):
        self.assertGreaterEqual(r.returncode, 0, "killed by a signal" + self.describe(r))
        self.assertNotIn(r.returncode, CRASH_CODES, "crash exit code" + self.describe(r))
        for t in CRASH_TEXT:
            self.assertNotIn(t, r.out, "crash text %r on stdout" % t + self.describe(r))
            self.assertNotIn(t, r.err, "crash text %r on stderr" % t + self.describe(r))

    def assertCleanError(self, r, *needs):
        """rc 1, one 'error: ' line on stderr holding every need.

        A need is a string (must appear, case-sensitive), a tuple of strings (one of
        them must appear, case-insensitive) or a compiled regex (must match).
        Returns the error line.
        """
        self.assertNoCrash(r)
        self.assertEqual(r.returncode, 1, "exit code must be exactly 1" + self.describe(r))
        lines = r.err.splitlines()
        self.assertEqual(len(lines), 1, "stderr must be exactly one line" + self.describe(r))
        line = lines[0]
        self.assertTrue(line.startswith("error: "),
                        "stderr must start with 'error: '" + self.describe(r))
        for need in needs:
            if isinstance(need, tuple):
                self.assertTrue(any(n.lower() in line.lower() for n in need),
                                "error line names none of %r" % (need,) + self.describe(r))
            elif isinstance(need, re.Pattern):
                self.assertRegex(line, need, self.describe(r))
            else:
                self.assertIn(need, line, "error line must name %r" % need + self.describe(r))
        return line

    def assertLoadFails(self, model, *needs, commands=("logits", "info", "bench")):
        """Every command that loads `model` fails cleanly with `needs` in the error."""
        for c in commands:
            with self.subTest(command=c):
                if c == "logits":
                    r, out = self.logits(model)
                    self.assertCleanError(r, *needs)
                    self.assertFalse(os.path.exists(out), "a .npy was written on error")
                elif c == "info":
                    self.assertCleanError(self.run_dory(["info", "-m", model]), *needs)
                else:
                    self.assertCleanError(self.run_dory(
                        ["bench", "-m", model, "-p", "4", "-n", "2", "-r", "1", "-t", "1"]),
                        *needs)

    def assertWorks(self, model):
        r, out = self.logits(model)
        self.assertEqual(r.returncode, 0, "good checkpoint must work" + self.describe(r))
        self.assertTrue(os.path.isfile(out), "good run wrote no .npy" + self.describe(r))
        os.remove(out)
        self.assertNoCrash(r)
        r = self.run_dory(["info", "-m", model])
        self.assertEqual(r.returncode, 0, "info on a good checkpoint" + self.describe(r))


FILE = "model.safetensors"
TRUNC = ("truncated",)


class GoodInput(CliCase):
    """The controls: without them every failure below could be a broken binary."""

    def test_good_single_file(self):
        self.assertWorks(fresh())

    def test_good_sharded(self):
        self.assertWorks(fresh(shards=2))

    def test_good_file_inside_dir(self):
        m = fresh()
        self.assertWorks(st_path(m))
        self.assertWorks(os.path.join(m, "config.json"))

    def test_helpers_roundtrip(self):
        """st_pack of an unchanged tensor list still loads: the corruptions are the cause."""
        m = fresh()
        tensors, meta = st_tensors(st_path(m))
        st_pack(st_path(m), tensors, meta)
        self.assertWorks(m)
        edit_header(st_path(m), lambda h: None)
        edit_config(m, lambda c: None)
        self.assertWorks(m)

    def test_good_ids_edges(self):
        m = fresh()
        r, out = self.logits(m, ids="0,255")
        self.assertEqual(r.returncode, 0, self.describe(r))


class Truncated(CliCase):
    def test_cut_in_data_section(self):
        m = fresh()
        p = st_path(m)
        size = os.path.getsize(p)
        header, data = st_read(p)
        os.truncate(p, size - len(data) // 2)
        self.assertLoadFails(m, FILE, TRUNC)

    def test_cut_last_byte(self):
        m = fresh()
        p = st_path(m)
        os.truncate(p, os.path.getsize(p) - 1)
        self.assertLoadFails(m, FILE, TRUNC)

    def test_cut_in_header(self):
        m = fresh()
        p = st_path(m)
        with open(p, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
        os.truncate(p, 8 + hlen // 2)
        self.assertLoadFails(m, FILE, TRUNC)

    def test_zero_bytes(self):
        m = fresh()
        os.truncate(st_path(m), 0)
        self.assertLoadFails(m, FILE, TRUNC)

    def test_five_bytes(self):
        m = fresh()
        os.truncate(st_path(m), 5)
        self.assertLoadFails(m, FILE, TRUNC)

    def test_header_only(self):
        m = fresh()
        p = st_path(m)
        with open(p, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
        os.truncate(p, 8 + hlen)
        self.assertLoadFails(m, FILE, TRUNC)


class LyingHeader(CliCase):
    def test_end_beyond_file(self):
        m = fresh()
        p = st_path(m)
        header, data = st_read(p)
        b, e = header[ALPHA0]["data_offsets"]
        header[ALPHA0]["data_offsets"] = [len(data), len(data) + (e - b)]  # span still right
        st_write(p, header, data)
        self.assertLoadFails(m, FILE, ALPHA0, ("beyond", "past the end", "out of range",
                                               "exceeds", "truncated"))

    def test_begin_after_end(self):
        m = fresh()
        p = st_path(m)

        def fn(h):
            b, e = h[ALPHA0]["data_offsets"]
            h[ALPHA0]["data_offsets"] = [e, b]
        edit_header(p, fn)
        self.assertLoadFails(m, FILE, ALPHA0, ("begin",))

    def test_span_not_numel_times_size(self):
        m = fresh()
        p = st_path(m)
        header, data = st_read(p)
        # The last tensor in the data section: shrinking its span overlaps nothing.
        last = max((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][1])
        b, e = header[last]["data_offsets"]
        header[last]["data_offsets"] = [b, e - 2]
        st_write(p, header, data)
        self.assertLoadFails(m, FILE, last, ("span", "size", "needs", "bytes"))

    def test_overlapping_tensors(self):
        m = fresh()
        p = st_path(m)

        def fn(h):
            # k_proj and v_proj have the same shape: v_proj points into k_proj's bytes,
            # shifted by one row so the ranges overlap without being identical.
            b, e = h[K0]["data_offsets"]
            row = 64 * 2
            h[V0]["data_offsets"] = [b + row, e + row]
        edit_header(p, fn)
        self.assertLoadFails(m, FILE, ("overlap",), (K0, V0))

    def test_identical_ranges(self):
        m = fresh()
        p = st_path(m)
        edit_header(p, lambda h: h[V0].__setitem__("data_offsets", list(h[K0]["data_offsets"])))
        self.assertLoadFails(m, FILE, ("overlap", "share", "alias"), (K0, V0))

    def test_header_length_larger_than_file(self):
        m = fresh()
        p = st_path(m)
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.write((size).to_bytes(8, "little"))
        self.assertLoadFails(m, FILE, ("truncated", "header length", "larger than"))

    def test_header_length_huge(self):
        m = fresh()
        p = st_path(m)
        with open(p, "r+b") as f:
            f.write((1 << 62).to_bytes(8, "little"))
        self.assertLoadFails(m, FILE, ("truncated", "header length", "larger than"))

    def test_header_not_json(self):
        m = fresh()
        p = st_path(m)
        _, data = st_read(p)
        st_write_raw(p, b'{"lm_head.weight": {"dtype": "BF16", "shape": [256', data)
        self.assertLoadFails(m, FILE, "JSON")

    def test_header_binary_garbage(self):
        m = fresh()
        p = st_path(m)
        _, data = st_read(p)
        st_write_raw(p, bytes(range(1, 200)), data)
        self.assertLoadFails(m, FILE, "JSON")

    def test_header_not_object(self):
        m = fresh()
        p = st_path(m)
        _, data = st_read(p)
        st_write_raw(p, b"[1, 2, 3]", data)
        self.assertLoadFails(m, FILE, ("object",))

    def test_entry_not_object(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h.__setitem__(ALPHA0, [1, 2]))
        self.assertLoadFails(m, FILE, ALPHA0)

    def test_negative_dimension(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__("shape", [-64]))
        self.assertLoadFails(m, FILE, ALPHA0, ("shape", "dimension"))

    def test_absurd_shape(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__("shape", [1 << 32, 1 << 32]))
        self.assertLoadFails(m, FILE, ALPHA0, ("shape",))

    def test_scalar_shape(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__("shape", []))
        self.assertLoadFails(m, FILE, ALPHA0)

    def test_offset_near_u64_max(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__(
            "data_offsets", [(1 << 64) - 128, (1 << 64) - 1]))
        self.assertLoadFails(m, FILE, ALPHA0)

    def test_negative_offset(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__("data_offsets", [-2, 126]))
        self.assertLoadFails(m, FILE, ALPHA0, "data_offsets")

    def test_control_char_in_tensor_name(self):
        """A name from the file is untrusted: a raw newline must not split the error line."""
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        tensors.append(("evil\nname", "BF16", [2], b"\0" * 4))
        st_pack(p, tensors, meta)
        self.assertLoadFails(m, "evil", ("unexpected", "unknown", "extra"))

    def test_control_char_in_dtype(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].__setitem__("dtype", "BF\n16"))
        self.assertLoadFails(m, FILE, ALPHA0, ("dtype",))

    def test_missing_offsets(self):
        m = fresh()
        edit_header(st_path(m), lambda h: h[ALPHA0].pop("data_offsets"))
        self.assertLoadFails(m, FILE, ALPHA0, "data_offsets")


class UnknownDtype(CliCase):
    def _retype(self, dtype, elem_size):
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        out = []
        for name, dt, shape, raw in tensors:
            if name == ALPHA0:
                shape = [len(raw) // elem_size]  # byte sizes stay consistent
                dt = dtype
            out.append((name, dt, shape, raw))
        st_pack(p, out, meta)
        self.assertLoadFails(m, FILE, ALPHA0, dtype, ("dtype",))

    def test_i64(self):
        self._retype("I64", 8)

    def test_f8_e4m3(self):
        self._retype("F8_E4M3", 1)

    def test_made_up(self):
        self._retype("Q4_K", 1)


class ShapeVsConfig(CliCase):
    def test_q_proj_wrong_rows(self):
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        out = []
        for name, dt, shape, raw in tensors:
            if name == Q0:
                rows = shape[0] - 16
                shape = [rows, shape[1]]
                raw = raw[:rows * shape[1] * 2]
            out.append((name, dt, shape, raw))
        st_pack(p, out, meta)  # consistent file: only the config check can catch it
        self.assertLoadFails(m, Q0, ("shape",))

    def test_vector_as_matrix(self):
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        out = [(n, d, ([8, 8] if n == ALPHA0 else s), r) for n, d, s, r in tensors]
        st_pack(p, out, meta)
        self.assertLoadFails(m, ALPHA0, ("shape",))


class MissingOrExtraTensor(CliCase):
    def test_missing_tensor(self):
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        st_pack(p, [t for t in tensors if t[0] != LOGIT_SCALE], meta)
        self.assertLoadFails(m, LOGIT_SCALE, ("missing",))

    def test_missing_layer_tensor(self):
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        st_pack(p, [t for t in tensors if t[0] != Q0], meta)
        self.assertLoadFails(m, Q0, ("missing",))

    def test_extra_tensor(self):
        extra = "backbone.layers.0.mixer.bogus.weight"
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        tensors.append((extra, "BF16", [4, 4], b"\0" * 32))
        st_pack(p, tensors, meta)
        self.assertLoadFails(m, extra, ("unexpected", "unknown", "extra"))

    def test_extra_layer_beyond_config(self):
        extra = "backbone.layers.12.attn_alpha"
        m = fresh()
        p = st_path(m)
        tensors, meta = st_tensors(p)
        tensors.append((extra, "BF16", [64], b"\0" * 128))
        st_pack(p, tensors, meta)
        self.assertLoadFails(m, extra, ("unexpected", "unknown", "extra"))


def _key(k):
    """Regex that matches the config key k as a whole word (ngpt is not fngpt)."""
    return re.compile(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(k))


class BadConfig(CliCase):
    def check_config(self, fn, *needs):
        m = fresh()
        edit_config(m, fn)
        self.assertLoadFails(m, "config.json", *needs)

    def test_missing_keys(self):
        for k in ("hidden_size", "hybrid_layer_pattern", "init_method_std", "vocab_size",
                  "num_attention_heads", "n_recurrent_loops"):
            with self.subTest(key=k):
                self.check_config(lambda c: c.pop(k), _key(k), ("missing", "required"))

    def test_out_of_range_values(self):
        for k, v in (("hidden_size", 0), ("hidden_size", -64), ("num_attention_heads", 0),
                     ("num_key_value_heads", 0), ("vocab_size", 0), ("intermediate_size", 0),
                     ("num_hidden_layers", 0), ("n_recurrent_loops", 0),
                     ("n_recurrent_loops", 1000000), ("swa_window_size", 0),
                     ("rope_theta", 0), ("partial_rotary_factor", 0.0),
                     ("partial_rotary_factor", 2.0), ("max_position_embeddings", 0),
                     ("init_method_std", 0), ("hidden_size", 9999999999999),
                     ("hidden_size", 1e300), ("rope_profile_layers", [1, 2])):
            with self.subTest(key=k, value=v):
                self.check_config(lambda c: c.__setitem__(k, v), _key(k))

    def test_head_dim_disagrees(self):
        self.check_config(lambda c: c.__setitem__("head_dim", 8),
                          _key("head_dim"), _key("attention_head_dim"))

    def test_null_key(self):
        self.check_config(lambda c: c.__setitem__("hidden_size", None), _key("hidden_size"))

    def test_pattern_length(self):
        self.check_config(lambda c: c.__setitem__("hybrid_layer_pattern", "S-*-*-S-S-*"),
                          ("hybrid_layer_pattern", "num_hidden_layers"))

    def test_layer_counts_sum(self):
        self.check_config(lambda c: c.__setitem__("n_recurrent_layers", 5),
                          ("n_input_layers", "n_recurrent_layers", "n_output_layers"))

    def test_pattern_bad_char(self):
        self.check_config(lambda c: c.__setitem__("hybrid_layer_pattern", "S-*-*-S-X-*-"),
                          _key("hybrid_layer_pattern"), "X")

    def test_fixed_ngpt(self):
        self.check_config(lambda c: c.__setitem__("ngpt", False), _key("ngpt"))

    def test_fixed_activation(self):
        self.check_config(lambda c: c.__setitem__("mlp_hidden_act", "gelu"),
                          _key("mlp_hidden_act"), "gelu")

    def test_fixed_model_type(self):
        self.check_config(lambda c: c.__setitem__("model_type", "llama"), _key("model_type"))

    def test_wrong_type(self):
        self.check_config(lambda c: c.__setitem__("hidden_size", "64"), _key("hidden_size"))

    def test_wrong_type_float_int(self):
        self.check_config(lambda c: c.__setitem__("num_hidden_layers", 12.5),
                          _key("num_hidden_layers"))

    def test_kv_heads_not_dividing(self):
        self.check_config(lambda c: c.__setitem__("num_key_value_heads", 3),
                          ("num_key_value_heads", "num_attention_heads"))

    def test_kv_mode_bad(self):
        self.check_config(lambda c: c.__setitem__("recurrent_kv_cache_mode", "bogus"),
                          ("recurrent_kv_cache_mode", "bogus"))

    def test_not_json(self):
        m = fresh()
        with open(os.path.join(m, "config.json"), "w") as f:
            f.write('{"hidden_size": 64,\n  "vocab_size": \n')
        self.assertLoadFails(m, "config.json", "JSON")

    def test_not_object(self):
        m = fresh()
        with open(os.path.join(m, "config.json"), "w") as f:
            f.write("[64, 96]\n")
        self.assertLoadFails(m, "config.json", ("object",))

    def test_empty_file(self):
        m = fresh()
        open(os.path.join(m, "config.json"), "w").close()
        self.assertLoadFails(m, "config.json", ("JSON", "empty"))


SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


class Sharded(CliCase):
    def test_missing_shard_file(self):
        m = fresh(shards=2)
        os.remove(os.path.join(m, SHARD2))
        self.assertLoadFails(m, SHARD2, ("no such file", "missing", "not found",
                                         "cannot open", "does not exist"))

    def test_index_names_nonexistent_shard(self):
        m = fresh(shards=2)
        ghost = "model-00003-of-00003.safetensors"
        edit_index(m, lambda i: i["weight_map"].__setitem__(LOGIT_SCALE, ghost))
        self.assertLoadFails(m, ghost)

    def test_index_names_missing_shard_only(self):
        """A shard that only the index names (for a tensor of its own) must be reported."""
        m = fresh(shards=2)
        ghost = "model-00003-of-00003.safetensors"
        edit_index(m, lambda i: i["weight_map"].__setitem__("zzz.weight", ghost))
        self.assertLoadFails(m, ghost, ("no such file", "missing", "not found",
                                        "cannot open", "does not exist"))

    def test_index_shard_outside_dir(self):
        for bad in ("../base-1/model.safetensors", "/etc/passwd"):
            with self.subTest(shard=bad):
                m = fresh(shards=2)
                edit_index(m, lambda i: i["weight_map"].__setitem__("zzz.weight", bad))
                self.assertLoadFails(m, INDEX, bad)

    def test_index_empty_weight_map(self):
        m = fresh(shards=2)
        edit_index(m, lambda i: i.__setitem__("weight_map", {}))
        self.assertLoadFails(m, INDEX, "weight_map")

    def test_index_entry_not_string(self):
        m = fresh(shards=2)
        edit_index(m, lambda i: i["weight_map"].__setitem__(LOGIT_SCALE, 7))
        self.assertLoadFails(m, INDEX, LOGIT_SCALE)

    def test_tensor_in_two_shards(self):
        m = fresh(shards=2)
        first, _ = st_tensors(os.path.join(m, SHARD1))
        p2 = os.path.join(m, SHARD2)
        second, meta = st_tensors(p2)
        st_pack(p2, second + [first[0]], meta)
        self.assertLoadFails(m, first[0][0], (SHARD1, SHARD2))

    def test_index_tensor_in_other_shard(self):
        m = fresh(shards=2)
        with open(os.path.join(m, INDEX)) as f:
            wm = json.load(f)["weight_map"]
        name = "backbone.embeddings.weight"
        self.assertEqual(wm[name], SHARD1)
        edit_index(m, lambda i: i["weight_map"].__setitem__(name, SHARD2))
        self.assertLoadFails(m, name)

    def test_index_tensor_in_no_shard(self):
        m = fresh(shards=2)
        ghost = "backbone.layers.3.mixer.ghost.weight"
        edit_index(m, lambda i: i["weight_map"].__setitem__(ghost, SHARD2))
        self.assertLoadFails(m, ghost)

    def test_index_not_json(self):
        m = fresh(shards=2)
        with open(os.path.join(m, INDEX), "w") as f:
            f.write('{"weight_map": {')
        self.assertLoadFails(m, INDEX, "JSON")

    def test_index_without_weight_map(self):
        m = fresh(shards=2)
        edit_index(m, lambda i: i.pop("weight_map"))
        self.assertLoadFails(m, INDEX, "weight_map")

    def test_truncated_shard(self):
        m = fresh(shards=2)
        p = os.path.join(m, SHARD2)
        os.truncate(p, os.path.getsize(p) - 100)
        self.assertLoadFails(m, SHARD2, TRUNC)


class BadIds(CliCase):
    def check_ids(self, ids, *needs):
        m = fresh()
        r, out = self.logits(m, ids=ids)
        self.assertCleanError(r, *needs)
        self.assertFalse(os.path.exists(out), "a .npy was written on error")

    def test_too_large(self):
        self.check_ids("0,99999", "99999", ("range", "vocab"))

    def test_equal_to_vocab(self):
        self.check_ids("1,256", "256", ("range", "vocab"))

    def test_negative(self):
        self.check_ids("-1", "-1")

    def test_negative_in_list(self):
        self.check_ids("3,-1,2", "-1")

    def test_non_numeric(self):
        self.check_ids("1,x,3", "'x'")

    def test_float(self):
        self.check_ids("1,2.5", "2.5")

    def test_overflow(self):
        self.check_ids("1,99999999999999999999", "99999999999999999999")

    def test_empty(self):
        self.check_ids("", "--ids")

    def test_empty_element(self):
        self.check_ids("1,,3", "--ids")

    def test_trailing_comma(self):
        self.check_ids("1,2,", "--ids")


class BadFlags(CliCase):
    """CLI11 parse errors: its own non-zero codes, a message naming the option."""

    def check_flag(self, extra, option):
        m = fresh()
        r, out = self.logits(m, extra=extra)
        self.assertNoCrash(r)
        self.assertNotEqual(r.returncode, 0, "bad flag accepted" + self.describe(r))
        self.assertIn(option, r.err + r.out, "message must name %s" % option + self.describe(r))
        self.assertFalse(os.path.exists(out), "a .npy was written on error")

    def test_loops_zero(self):
        self.check_flag(["--loops", "0"], "--loops")

    def test_loops_17(self):
        self.check_flag(["--loops", "17"], "--loops")

    def test_loops_not_number(self):
        self.check_flag(["--loops", "two"], "--loops")

    def test_chunk_zero(self):
        self.check_flag(["--chunk", "0"], "--chunk")

    def test_kv_bogus(self):
        self.check_flag(["--kv", "bogus"], "--kv")

    def test_threads_zero(self):
        self.check_flag(["-t", "0"], "--threads")

    def test_unknown_flag(self):
        self.check_flag(["--frobnicate"], "--frobnicate")

    def test_bench_bad_counts(self):
        m = fresh()
        r = self.run_dory(["bench", "-m", m, "-p", "x", "-n", "2", "-r", "1"])
        self.assertNoCrash(r)
        self.assertNotEqual(r.returncode, 0, self.describe(r))


class BadPath(CliCase):
    def test_nonexistent(self):
        p = os.path.join(_TMP, "no-such-model")
        self.assertLoadFails(p, "no-such-model", ("no such", "not found", "does not exist"))

    def test_dir_without_config(self):
        m = fresh()
        os.remove(os.path.join(m, "config.json"))
        self.assertLoadFails(m, "config.json")

    def test_dir_without_weights(self):
        m = fresh()
        os.remove(st_path(m))
        self.assertLoadFails(m, "model.safetensors")

    def test_empty_dir(self):
        d = tempfile.mkdtemp(dir=_TMP)
        self.assertLoadFails(d, "config.json")

    def test_gguf(self):
        p = os.path.join(_TMP, "dory-tiny.gguf")
        with open(p, "wb") as f:
            f.write(b"GGUF" + b"\3\0\0\0" + b"\0" * 56)
        # A valid, empty GGUF: no Dory metadata (tests/gguf has the hostile GGUF cases).
        self.assertLoadFails(p, "gguf", ("general.architecture",), ("missing",))

    def test_other_file(self):
        m = fresh()
        p = os.path.join(m, "README.txt")
        with open(p, "w") as f:
            f.write("hello\n")
        self.assertLoadFails(p, "README.txt")


if __name__ == "__main__":
    unittest.main()
