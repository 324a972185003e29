#!/usr/bin/python3
"""Chat template parity: `dory template` against Python's jinja2, character for
character, on real published templates (tests/data/templates/*.jinja) and many
contexts (tests/template/contexts.py).

For every (template, context):
  * jinja2 renders it (configured as transformers does: jinja_ref.py);
  * `dory template -t T -c CONTEXT.json --now ...` renders it;
  * where jinja2 succeeds, dory must exit 0 with exactly the same text;
  * where jinja2 fails (raise_exception, or a Python error such as str + None),
    dory must exit 1 with one "error: chat template line N: ..." line, and a
    raise_exception message must appear in it.

Run (Debian's python with python3-jinja2):
    DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/template -v
Every test FAILS (it does not skip) when DORY_BIN is unset or not executable.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import contexts  # noqa: E402
import jinja_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
TEMPLATE_DIR = os.path.join(ROOT, "tests", "data", "templates")
TEMPLATES = sorted(glob.glob(os.path.join(TEMPLATE_DIR, "*.jinja")))
CRASH_TEXT = ("Traceback", "Aborted", "terminate called", "Segmentation", "core dumped",
              "AddressSanitizer", "runtime error:", "what():", "std::")
ERROR_LINE = re.compile(r"^error: chat template line \d+: .+$")

SUMMARY = {}


def dory_bin():
    path = os.environ.get("DORY_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("DORY_BIN must name the dory binary (got %r)" % path)
    return path


def run_dory(template, ctx_path):
    p = subprocess.run([dory_bin(), "template", "-t", template, "-c", ctx_path, "--now", jinja_ref.NOW_ARG],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    return p.returncode, p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")


def first_difference(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return "at char %d: jinja2 %r vs dory %r" % (n, a[max(0, n - 40):n + 40], b[max(0, n - 40):n + 40])


class TemplateParity(unittest.TestCase):
    def check_template(self, template):
        with open(template, encoding="utf-8") as f:
            source = f.read()
        tmp = tempfile.mkdtemp(prefix="dory_template_")
        self.addCleanup(shutil.rmtree, tmp, True)
        stats = {"contexts": 0, "rendered": 0, "rejected": 0}
        for k, (name, ctx) in enumerate(contexts.contexts()):
            ctx_path = os.path.join(tmp, "ctx%d.json" % k)
            with open(ctx_path, "w", encoding="utf-8") as f:
                json.dump(ctx, f, ensure_ascii=False)
            with open(ctx_path, encoding="utf-8") as f:
                ctx_loaded = json.load(f)  # exactly what dory reads
            status, expected = jinja_ref.render(source, ctx_loaded)
            rc, out, err = run_dory(template, ctx_path)
            stats["contexts"] += 1
            with self.subTest(context=name):
                for t in CRASH_TEXT:
                    self.assertNotIn(t, err, "crash text in stderr")
                if status == "ok":
                    stats["rendered"] += 1
                    self.assertEqual(rc, 0, "jinja2 rendered it but dory failed: %s" % err.strip())
                    self.assertEqual(err, "")
                    if out != expected:
                        self.fail("rendering differs " + first_difference(expected, out))
                else:
                    stats["rejected"] += 1
                    self.assertEqual(rc, 1, "jinja2 failed (%s) but dory exited %d with %r" % (expected, rc, out[:200]))
                    self.assertEqual(out, "")
                    lines = err.splitlines()
                    self.assertEqual(len(lines), 1, err)
                    self.assertRegex(lines[0], ERROR_LINE)
                    if expected.startswith("TemplateError: "):  # raise_exception("...")
                        self.assertIn(expected[len("TemplateError: "):], lines[0])
        SUMMARY[os.path.basename(template)] = stats

    @classmethod
    def tearDownClass(cls):
        if SUMMARY:
            sys.stderr.write("\ntemplate parity (contexts compared: rendered by both / rejected by both):\n")
            for name, st in sorted(SUMMARY.items()):
                sys.stderr.write("  %-28s %3d contexts: %3d rendered, %3d rejected\n"
                                 % (name, st["contexts"], st["rendered"], st["rejected"]))


def _add_tests():
    for path in TEMPLATES:
        name = os.path.splitext(os.path.basename(path))[0]
        setattr(TemplateParity, "test_" + re.sub(r"\W", "_", name), lambda self, p=path: self.check_template(p))


_add_tests()


class TemplateSet(unittest.TestCase):
    def test_enough_templates(self):
        # The published styles this suite must cover.
        names = {os.path.basename(p) for p in TEMPLATES}
        for need in ("chatml", "llama3", "mistral", "gemma", "nemotron", "phi3", "qwen", "deepseek"):
            self.assertTrue(any(n.startswith(need) for n in names), need)


if __name__ == "__main__":
    unittest.main()
