#!/usr/bin/python3
"""Accuracy of a model on the held-out task suite (tasks.py) at several loop counts, through
dory itself: each question goes through the model's chat template (`dory run --chat`-style
ChatML prompt), greedy, and counts when the answer's first line equals the expected one.

    /usr/bin/python3 scripts/train/task_eval.py [-m MODEL] [--items .traindata/tasks_val.jsonl]
        [--loops 1,2,4] [--n 200] [--dory build/dory]

Prints a table: task x loops, then the overall accuracy per loop count. Uses one `dory serve`
(its /v1/completions with the prompt pre-rendered) so the model loads once.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tasks as T  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="")
    ap.add_argument("--items", default=os.path.join(ROOT, ".traindata", "tasks_val.jsonl"))
    ap.add_argument("--loops", default="1,2,4")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--dory", default=os.path.join(ROOT, "build", "dory"))
    a = ap.parse_args()
    if os.path.exists(a.items):
        items = [json.loads(s) for s in open(a.items)][: a.n]
    else:
        items = T.items(a.n, 2)
    loops = [int(x) for x in a.loops.split(",")]
    port = free_port()
    cmd = [a.dory, "serve", "--port", str(port)] + (["-m", a.model] if a.model else [])
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d" % port
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except Exception:
                time.sleep(0.1)
        table = {}
        for L in loops:
            for it in items:
                body = {"prompt": T.chatml(it, answer=False), "max_tokens": 40, "temperature": 0,
                        "loops": L, "stop": ["<|im_end|>", "\n"]}
                req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                text = json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]
                ok = text.strip() == it["a"]
                key = (it["task"], L)
                n, k = table.get(key, (0, 0))
                table[key] = (n + 1, k + ok)
        print("| task | " + " | ".join("loops %d" % L for L in loops) + " |")
        print("| --- |" + " ---: |" * len(loops))
        for t in T.TASKS:
            cells = []
            for L in loops:
                n, k = table.get((t, L), (0, 0))
                cells.append("%.1f%% (%d/%d)" % (100.0 * k / max(1, n), k, n))
            print("| %s | %s |" % (t, " | ".join(cells)))
        tot = []
        for L in loops:
            n = sum(table[(t, L)][0] for t in T.TASKS if (t, L) in table)
            k = sum(table[(t, L)][1] for t in T.TASKS if (t, L) in table)
            tot.append("%.1f%% (%d/%d)" % (100.0 * k / max(1, n), k, n))
        print("| all | %s |" % " | ".join(tot))
    finally:
        srv.terminate()
        srv.wait(10)


if __name__ == "__main__":
    main()
