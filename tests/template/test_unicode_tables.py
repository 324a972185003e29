#!/usr/bin/python3
"""src/text/jinja_unicode.cpp must hold the Unicode tables of the Python that
jinja2 runs on here (so str.upper(), title(), isalpha(), repr() agree)."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


class UnicodeTables(unittest.TestCase):
    def test_tables_match_this_python(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "make_unicode_tables.py"), "--check"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout.decode())


if __name__ == "__main__":
    unittest.main()
