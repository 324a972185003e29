#!/usr/bin/python3
"""Runs one folder of Python unittest modules as a ctest suite, and fails when it ran no
test (a suite that tests nothing must not pass): unittest in Debian 12's Python 3.11 exits
0 on an empty discovery. When every test skipped itself (the GPU suite on a machine without a
GPU) it exits 77, which ctest reports as a skipped test.

  /usr/bin/python3 tests/run_suite.py tests/SUITE
"""
import os
import sys
import unittest


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: run_suite.py SUITE_DIR")
    top = os.path.abspath(sys.argv[1])
    suite = unittest.defaultTestLoader.discover(top, top_level_dir=top)
    result = unittest.TextTestRunner(verbosity=1).run(suite)
    if result.testsRun == 0 and not result.skipped:
        print("%s: ran no test (a suite must run at least one)" % top, file=sys.stderr)
        return 1
    if result.wasSuccessful() and result.skipped and len(result.skipped) >= result.testsRun:
        # Every test skipped (the GPU suite without a GPU): ctest shows the suite as skipped.
        print("%s: skipped: %s" % (top, result.skipped[0][1]), file=sys.stderr)
        return 77
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
