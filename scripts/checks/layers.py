#!/usr/bin/python3
"""The include graph flows one way. Every #include "..." of a file under include/ and src/
must point into its own layer or a layer below, in this order:

  public plain settings   dory/error.h, dory/options.h, then dory/model.h
  tensor    dtypes, quantizers, CPU kernels
  format    safetensors, GGUF, config.json readers
  text      tokenizer, chat templates (GGUF's tokenizer keys come from format)
  model     config, host weights, loop plan, turbo files, gate math: no backend code
  backend   backend.h and its implementations (cpu/, cuda/); public dory/backend.h
  runtime   session, generation path, sampler; public dory/session.h, dory/generate.h
  server    the HTTP server

(tools/ sits on top and may include anything.) A public header counts as part of the layer
that implements it. So nothing under src/model or src/format includes dory/session.h, and
no two layers include each other. Prints each breach and exits 1; prints a one-line summary
and exits 0 when there is none.

  /usr/bin/python3 scripts/checks/layers.py [ROOT]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))

# Rank of each unit; a file may include its own unit and units of lower rank.
RANK = {
    "dory/error.h": 0, "dory/options.h": 0, "dory/model.h": 1,
    "tensor": 2, "format": 3, "text": 4, "model": 5,
    "backend": 6, "dory/backend.h": 6,
    "runtime": 7, "dory/session.h": 7, "dory/generate.h": 7,
    "server": 8,
}
# Units that are one layer (a public header and the folder that implements it).
LAYER = {"dory/backend.h": "backend", "dory/session.h": "runtime", "dory/generate.h": "runtime"}


def unit_of_include(inc):
    if inc.startswith("dory/"):
        return inc if inc in RANK else None
    head = inc.split("/")[0]
    return head if head in RANK else None


def unit_of_file(rel):
    parts = rel.split(os.sep)
    if parts[0] == "include":
        return "/".join(parts[1:3])
    if parts[0] == "src":
        return parts[1]
    return None


def main():
    breaches, edges, files = [], set(), 0
    for top in ("include", "src"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for n in sorted(names):
                if not n.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(d, n)
                rel = os.path.relpath(path, ROOT)
                me = unit_of_file(rel)
                if me not in RANK:
                    breaches.append("%s: not in a known layer (add it to scripts/checks/layers.py)" % rel)
                    continue
                files += 1
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if not m:
                            continue
                        inc = m.group(1)
                        other = unit_of_include(inc)
                        if other is None:
                            if not os.path.exists(os.path.join(d, inc)):
                                breaches.append("%s:%d: includes %s, which is in no layer" % (rel, lineno, inc))
                            continue
                        a, b = LAYER.get(me, me), LAYER.get(other, other)
                        if a == b:
                            continue
                        edges.add((a, b))
                        if RANK[other] >= RANK[me]:
                            breaches.append("%s:%d: %s includes %s, a layer at or above its own"
                                            % (rel, lineno, me, inc))
    for a, b in sorted(edges):
        if (b, a) in edges and a < b:
            breaches.append("cycle: %s and %s include each other" % (a, b))
    for b in breaches:
        print(b)
    if breaches:
        print("layers: %d breaches in %d files" % (len(breaches), files))
        return 1
    print("layers: %d files, %d folder-to-folder edges, all downward, no cycle" % (files, len(edges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
