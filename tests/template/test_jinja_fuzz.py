#!/usr/bin/python3
"""Randomized parity with jinja2 (fixed seeds, so every run is the same):
  * whitespace: templates assembled from text with spaces, tabs and newlines,
    block tags, print tags and comments, each with random -/+ modifiers: the
    lexer's trim_blocks / lstrip_blocks / strip logic must match exactly;
  * expressions: random operator, filter and test combinations over numbers,
    strings, lists and undefined values: values, precedence and which inputs
    are errors must match.

Run: DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/template -v
"""

import atexit
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jinja_ref  # noqa: E402

TMP = tempfile.mkdtemp(prefix="dory_jinja_fuzz_")
atexit.register(shutil.rmtree, TMP, True)
ERROR_LINE = re.compile(r"^error: chat template line \d+: .+$")
CTX = {"a": 3, "b": -2, "f": 1.5, "s": "Ab c", "e": "", "l": [1, 2, 3], "d": {"k": "v", "n": 2}, "z": None}


def dory_bin():
    path = os.environ.get("DORY_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("DORY_BIN must name the dory binary (got %r)" % path)
    return path


def random_whitespace_template(rng):
    texts = ["", " ", "  ", "\t", "\n", "\n\n", " \n ", "x", " x ", "\n  x\n", "  \t\n", "y\n  ", "\r\n"]
    mods = ["", "", "", "-", "+"]
    out = []
    depth = 0
    for _ in range(rng.randint(1, 12)):
        out.append(rng.choice(texts))
        kind = rng.random()
        lm, rm = rng.choice(mods), rng.choice(mods)
        if kind < 0.25:
            out.append("{%" + lm + " if true " + rm + "%}")
            depth += 1
        elif kind < 0.4 and depth:
            out.append("{%" + lm + " endif " + rm + "%}")
            depth -= 1
        elif kind < 0.6:
            out.append("{{" + lm.replace("+", "") + " 'v' " + rm.replace("+", "") + "}}")
        elif kind < 0.75:
            out.append("{#" + lm + " c " + rm + "#}")
        elif kind < 0.85:
            out.append("{%" + lm + " set q = 1 " + rm + "%}")
        else:
            out.append("{%" + lm + " for i in [1, 2] " + rm + "%}" + rng.choice(texts) + "{{ i }}" +
                       rng.choice(texts) + "{%" + rng.choice(mods) + " endfor " + rng.choice(mods) + "%}")
    out.append(rng.choice(texts))
    while depth:
        out.append("{%" + rng.choice(mods) + " endif " + rng.choice(mods) + "%}" + rng.choice(texts))
        depth -= 1
    return "".join(out)


ATOMS = ["a", "b", "f", "s", "e", "l", "d", "z", "missing", "0", "1", "2", "-1", "2.5", "'x'", "'ab'", "''",
         "[1, 2]", "[]", "none", "true", "false", "(1, 'y')", "{'k': 1}", "d.k", "d['n']", "l[0]", "l[-1]",
         "s[1:]", "l[::-1]", "s.upper()", "s.split()", "s.split(' ', 1)", "s.strip('A')", "s.replace('b', 'B')",
         "s.startswith('A')", "s.find('c')", "s.title()", "s[-2]", "s[::2]", "l[1:2]", "d.get('k')", "d.get('x', 0)",
         "d.keys()|list", "d.values()|list", "d|dictsort", "'%s-%d' % ('p', 3)", "'{}'.format(a)", "range(3)|list",
         "(a, b)", "1e3", "-0.5", "3 // 2", "7 % 3", "'\u00e9'", "l|select('odd')|list", "l|map('string')|join",
         "namespace(v=1).v", "loop", "l|length", "s|wordcount", "'x' * 2", "[1] + [2]", "'a' ~ 1"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
FILTERS = ["center(6)", "indent(2)", "replace('a', 'z')", "truncate(5, true)", "batch(2)|list", "dictsort",
           "attr('upper')", "format(1)", "int(7)", "float(1.5)", "round(1)", "round(0, 'ceil')", "escape", "safe",
           "selectattr('k')|list", "map(attribute='k')|list", "unique|list", "items|list", "reverse|list", "first|string",
           "length", "string", "upper", "lower", "trim", "first", "last", "list", "sort", "reverse", "int", "float",
           "abs", "round", "tojson", "join(',')", "default('D')", "default('D', true)", "unique", "sum", "max",
           "min", "capitalize", "title", "items", "count", "select('odd')", "map('string')"]
TESTS = ["sameas none", "gt 1", "le 2", "ne 'x'", "callable", "lower", "upper", "filter", "test", "defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "odd", "even", "true", "false", "boolean", "divisibleby 2", "eq 3", "in [1, 3]"]


def random_expr(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(ATOMS)
    if r < 0.55:
        return "%s %s %s" % (random_expr(rng, depth + 1), rng.choice(BINOPS), random_expr(rng, depth + 1))
    if r < 0.7:
        return "%s|%s" % (rng.choice(ATOMS), rng.choice(FILTERS))
    if r < 0.8:
        return "%s is %s%s" % (rng.choice(ATOMS), rng.choice(["", "not "]), rng.choice(TESTS))
    if r < 0.87:
        return "not " + random_expr(rng, depth + 1)
    if r < 0.94:
        return "(%s if %s else %s)" % (random_expr(rng, depth + 1), random_expr(rng, depth + 1),
                                       random_expr(rng, depth + 1))
    return "-" + rng.choice(ATOMS)


STMT_VARS = ["a", "b", "s", "l", "d", "x", "y", "i", "ns.v", "loop.index", "loop.first", "loop.last",
             "loop.revindex", "loop.previtem", "loop.nextitem", "loop.length"]
SEQS = ["l", "d", "s", "[1, 2, 3]", "range(3)", "d.items()", "l|reverse", "[[1, 'a'], [2, 'b']]", "[]", "missing"]


def random_statements(rng, depth=0, in_loop=False, in_macro=False):
    """Nested for/if/set/macro/with/break/continue, to check scoping and control flow."""
    def expr():
        return rng.choice(STMT_VARS + ATOMS[:20]) if rng.random() < 0.5 else random_expr(rng, 1)
    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        ws = rng.choice(["", " ", "\n", "\n  ", "\t"])
        m1, m2 = rng.choice(["", "-", ""]), rng.choice(["", "-", ""])
        if depth > 3 or r < 0.25:
            out.append(ws + "{{" + m1 + " " + expr() + " " + m2 + "}}")
        elif r < 0.4:
            seq = rng.choice(SEQS)
            target = "x, y" if seq in ("d.items()", "[[1, 'a'], [2, 'b']]") else "x"
            cond = (" if " + expr()) if rng.random() < 0.3 else ""
            body = random_statements(rng, depth + 1, True, in_macro)
            other = ("{% else %}" + random_statements(rng, depth + 1, in_loop, in_macro)) if rng.random() < 0.3 else ""
            out.append(ws + "{%" + m1 + " for " + target + " in " + seq + cond + " " + m2 + "%}" + body + other +
                       "{% endfor %}")
        elif r < 0.55:
            body = random_statements(rng, depth + 1, in_loop, in_macro)
            elif_ = ("{% elif " + expr() + " %}" + random_statements(rng, depth + 1, in_loop, in_macro)) if rng.random() < 0.3 else ""
            else_ = ("{% else %}" + random_statements(rng, depth + 1, in_loop, in_macro)) if rng.random() < 0.4 else ""
            out.append(ws + "{%" + m1 + " if " + expr() + " " + m2 + "%}" + body + elif_ + else_ + "{% endif %}")
        elif r < 0.7:
            out.append(ws + "{%" + m1 + " set " + rng.choice(["x", "y", "a", "ns.v", "s"]) + " = " + expr() + " " + m2 + "%}")
        elif r < 0.75:
            out.append(ws + "{% set y %}" + random_statements(rng, depth + 1, in_loop, in_macro) + "{% endset %}")
        elif r < 0.82 and in_loop:
            out.append(ws + rng.choice(["{% break %}", "{% continue %}"]))
        elif r < 0.9 and not in_macro:
            out.append(ws + "{% macro mm(p, q=" + rng.choice(["1", "'z'", "p", "none"]) + ") %}" +
                       random_statements(rng, depth + 1, False, True) + "{% endmacro %}{{ mm(" + expr() +
                       ") }}{{ mm(1, q=2) }}")
        else:
            out.append(ws + "{% with x = " + expr() + " %}" + random_statements(rng, depth + 1, in_loop, in_macro) +
                       "{% endwith %}")
    return "".join(out)


class JinjaFuzz(unittest.TestCase):
    def compare(self, sources):
        cpath = os.path.join(TMP, "ctx.json")
        with open(cpath, "w", encoding="utf-8") as f:
            json.dump(CTX, f)
        mismatches = []
        for k, source in enumerate(sources):
            tpath = os.path.join(TMP, "t%d.jinja" % k)
            with open(tpath, "w", encoding="utf-8", newline="") as f:
                f.write(source)
            # A fresh copy each time: jinja2's filters may mutate their input (indent on a list).
            status, expected = jinja_ref.render(source, json.loads(json.dumps(CTX)))
            if status == "ok" and re.search(r" object (\w+ )?at 0x[0-9a-f]+>", expected):
                continue  # jinja2 printed a generator's address: nothing to compare
            p = subprocess.run([dory_bin(), "template", "-t", tpath, "-c", cpath], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=30)
            out, err = p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")
            if status == "ok":
                ok = p.returncode == 0 and out == expected
            else:
                lines = err.splitlines()
                ok = p.returncode == 1 and out == "" and len(lines) == 1 and ERROR_LINE.match(lines[0])
            if not ok:
                mismatches.append("%r: jinja2 %s %r, dory rc=%d %r %r" % (source, status, expected, p.returncode, out, err))
        self.assertEqual(mismatches, [], "\n" + "\n".join(mismatches[:20]))

    def test_whitespace_control(self):
        rng = random.Random(20240726)
        self.compare([random_whitespace_template(rng) for _ in range(400)])

    def test_statements(self):
        rng = random.Random(4321)
        self.compare(["{% set ns = namespace(v=0) %}" + random_statements(rng) for _ in range(300)])

    def test_expressions(self):
        rng = random.Random(1234)
        self.compare(["{{ %s }}" % random_expr(rng) for _ in range(600)])


if __name__ == "__main__":
    unittest.main()
