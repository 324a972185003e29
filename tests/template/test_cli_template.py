#!/usr/bin/python3
"""`dory template` as a person uses it: exact output on stdout (no added
newline), the --messages/--add-generation-prompt/--bos/--eos/--set/--now
conveniences, tokenizer_config.json input, and one clean error line (exit 1)
for every kind of bad input, including runaway templates.

Run: DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/template -v
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jinja_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
TEMPLATES = os.path.join(ROOT, "tests", "data", "templates")
CRASH_TEXT = ("Traceback", "Aborted", "terminate called", "Segmentation", "core dumped",
              "AddressSanitizer", "runtime error:", "what():", "std::")
TMP = tempfile.mkdtemp(prefix="dory_cli_template_")
atexit.register(shutil.rmtree, TMP, True)


def dory_bin():
    path = os.environ.get("DORY_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("DORY_BIN must name the dory binary (got %r)" % path)
    return path


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path


def run(*args, timeout=60):
    p = subprocess.run([dory_bin(), "template", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")


class TemplateCli(unittest.TestCase):
    def assert_error(self, rc, out, err, *needles):
        for t in CRASH_TEXT:
            self.assertNotIn(t, err)
        self.assertEqual(rc, 1, err)
        self.assertEqual(out, "")
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        for n in needles:
            self.assertIn(n, lines[0])

    def test_output_is_exact(self):
        t = write("exact.jinja", "{{ a }}\n\n  {{- b }}{% if c %}\n{% endif %}")
        c = write("exact.json", json.dumps({"a": "x", "b": "y\n", "c": True}))
        rc, out, err = run("-t", t, "-c", c)
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "xy\n")

    def test_conveniences(self):
        t = os.path.join(TEMPLATES, "mistral_v0_1.jinja")
        msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
        m = write("msgs.json", json.dumps(msgs))
        rc, out, err = run("-t", t, "--messages", m, "--bos", "<s>", "--eos", "</s>")
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "<s>[INST] Hi [/INST]Yo</s>")
        t2 = os.path.join(TEMPLATES, "chatml.jinja")
        rc, out, err = run("-t", t2, "--messages", m, "--add-generation-prompt")
        self.assertEqual(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>assistant\n")
        t3 = write("set.jinja", "{{ x|tojson }} {{ y }} {{ strftime_now('%Y-%m-%d %H:%M') }}")
        rc, out, err = run("-t", t3, "--set", 'x={"k":[1,2.5]}', "--set", "y=\"s\"", "--now", "2030-01-02T03:04")
        self.assertEqual((rc, out, err), (0, '{"k": [1, 2.5]} s 2030-01-02 03:04', ""))

    def test_context_and_flags_combine_like_transformers(self):
        # The parity suite's own renderer, on a context built by the flags.
        t = os.path.join(TEMPLATES, "llama3_2.jinja")
        msgs = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]
        m = write("msgs2.json", json.dumps(msgs))
        c = write("ctx2.json", json.dumps({"messages": [], "date_string": "09 Sep 2029"}))
        rc, out, err = run("-t", t, "-c", c, "--messages", m, "--add-generation-prompt", "--bos", "<|begin_of_text|>")
        with open(t, encoding="utf-8") as f:
            st, expected = jinja_ref.render(f.read(), {"messages": msgs, "date_string": "09 Sep 2029",
                                                       "add_generation_prompt": True, "bos_token": "<|begin_of_text|>"})
        self.assertEqual(st, "ok")
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, expected)

    def test_tokenizer_config(self):
        with open(os.path.join(TEMPLATES, "chatml.jinja"), encoding="utf-8") as f:
            chatml = f.read()
        m = write("msgs3.json", json.dumps([{"role": "user", "content": "Hi"}]))
        cfg = write("tokenizer_config.json", json.dumps({"bos_token": "<s>", "chat_template": chatml}))
        rc, out, err = run("-t", cfg, "--messages", m)
        self.assertEqual((rc, out, err), (0, "<|im_start|>user\nHi<|im_end|>\n", ""))
        cfg2 = write("tc_list.json", json.dumps({"chat_template": [{"name": "tool_use", "template": "T"},
                                                                    {"name": "default", "template": "D"}]}))
        self.assertEqual(run("-t", cfg2)[:2], (0, "D"))
        cfg3 = write("tc_none.json", json.dumps({"bos_token": "<s>"}))
        self.assert_error(*run("-t", cfg3), "no chat_template")

    def test_bad_input(self):
        good = os.path.join(TEMPLATES, "chatml.jinja")
        self.assert_error(*run("-t", os.path.join(TMP, "missing.jinja")), "cannot read template", "missing.jinja")
        bad_json = write("bad.json", "{\"messages\": [")
        self.assert_error(*run("-t", good, "-c", bad_json), "bad.json", "invalid JSON")
        arr = write("arr.json", "[1, 2]")
        self.assert_error(*run("-t", good, "-c", arr), "must be a JSON object")
        self.assert_error(*run("-t", good, "--messages", write("obj.json", "{}")), "messages must be a JSON array")
        self.assert_error(*run("-t", good, "--now", "yesterday"), "--now")
        self.assert_error(*run("-t", good, "--set", "novalue"), "--set")
        self.assert_error(*run("-t", good, "--set", "k={"), "--set k", "invalid JSON")
        broken = write("broken.jinja", "ok\n{% for m in messages %}\n{{ m.content }}\n")
        self.assert_error(*run("-t", broken), "chat template line 2:", "never closed")
        bad_filter = write("bad_filter.jinja", "\n\n{{ x | frobnicate }}")
        self.assert_error(*run("-t", bad_filter), "chat template line 3:", "no filter named 'frobnicate'")
        raised = os.path.join(TEMPLATES, "gemma2.jinja")
        m = write("sys.json", json.dumps([{"role": "system", "content": "S"}]))
        self.assert_error(*run("-t", raised, "--messages", m), "chat template line 1:", "System role not supported")
        p = subprocess.run([dory_bin(), "template"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertNotIn(p.returncode, (0, 134, 136, 137, 139))
        self.assertIn("--template", p.stderr.decode())

    def test_runaway_templates_stop_cleanly(self):
        loop = write("loop.jinja", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
        self.assert_error(*run("-t", loop, timeout=120), "loop iterations")
        rec = write("rec.jinja", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
        # "recursion too deep" at the 200-call limit; under AddressSanitizer's larger frames the
        # interpreter's stack bound comes first ("nests or recurses too deeply").
        self.assert_error(*run("-t", rec), "too deep")
        big = write("big.jinja", "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}")
        self.assert_error(*run("-t", big), "exceeds")
        deep = write("deep.jinja", "{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}")
        self.assert_error(*run("-t", deep), "nests too deeply")
        c = write("deep.json", "{\"v\": " + "[" * 100000 + "]" * 100000 + "}")
        rc, out, err = run("-t", write("v.jinja", "{{ v }}"), "-c", c)
        self.assert_error(rc, out, err)


if __name__ == "__main__":
    unittest.main()
