#!/usr/bin/python3
"""The built-in model's task suite: short questions whose answers take several steps of
computation, so a model that runs its recurrent block more times can answer more of them
(issue 29). Four tasks, each asked in plain words and answered with the bare result:

  add     "What is 4821 + 397?" -> "5218"              addition with carries (1-4 digits)
  reverse "Reverse the list: 3 9 1 7 4" -> "4 7 1 9 3"
  sort    "Sort the list: 8 2 5 2 9" -> "2 2 5 8 9"
  chain   "Let a = 7. Let b = a + 3. Let c = b - 2. What is c?" -> "8"   following assignments

Difficulty grows with the number of digits, items or assignments (levels 1-4). Items are
drawn from a seeded generator per split (train seed 1, held-out seed 2, and the held-out
questions never appear in train: a set of their texts is excluded), so every machine makes the
same files. Output (JSON lines, {"task", "level", "q", "a"}):

    /usr/bin/python3 scripts/train/tasks.py --out .traindata [--train 200000 --val 400] [--suite 2]
      OUT/tasks_train.jsonl.gz   OUT/tasks_val.jsonl

`chatml(item)` renders an item in the model's chat template (models/dory-mini's ChatML), which
is how train.py mixes them into training and how task_eval.py asks them.
"""
import argparse
import gzip
import json
import os
import random

TASKS = ("add", "reverse", "sort", "chain")
# The suite's version (tasks.py --suite, train.py --task-suite): 1 made the shipped model's
# data, 2 (addition of 1-4 digits) is the current one, 3 is 2 with longer lists (5-17 items:
# the built-in models answer 3-9 items right at every loop count, so those show no depth).
ADD_RANGES = {1: [(10, 999), (100, 9999), (1000, 99999), (10000, 999999)],
              2: [(1, 9), (10, 99), (100, 999), (100, 9999)],
              3: [(1, 9), (10, 99), (100, 999), (100, 9999)]}
LIST_LENS = {1: [3, 5, 7, 9], 2: [3, 5, 7, 9], 3: [5, 9, 13, 17]}
SUITE = 2


def make(task, level, rng):
    if task == "add":
        # Suite 2: level 1 one digit each ... level 4 3-4 digits; suite 1 (the shipped model's):
        # 2-3 ... 5-6 digits, where the built-in model stayed at 0-2% at every loop count, so
        # it measured nothing. At least one carry from level 2 on.
        lo, hi = ADD_RANGES[SUITE][level - 1]
        while True:
            a, b = rng.randint(lo, hi), rng.randint(1 if lo == 1 else 10, hi)
            carries = sum(1 for i in range(7) if (a // 10 ** i % 10) + (b // 10 ** i % 10) >= 10)
            if level == 1 or carries >= 1:
                break
        return "What is %d + %d?" % (a, b), str(a + b)
    if task in ("reverse", "sort"):
        n = LIST_LENS[SUITE][level - 1]
        xs = [rng.randint(0, 9) for _ in range(n)]
        ys = list(reversed(xs)) if task == "reverse" else sorted(xs)
        verb = "Reverse" if task == "reverse" else "Sort"
        return "%s the list: %s" % (verb, " ".join(map(str, xs))), " ".join(map(str, ys))
    if task == "chain":
        n = [2, 3, 4, 6][level - 1]
        names = rng.sample("abcdefghjkmnpqrstuvwxyz", n)
        val = rng.randint(1, 9)
        parts = ["Let %s = %d." % (names[0], val)]
        for i in range(1, n):
            k = rng.randint(1, 9)
            if rng.random() < 0.5 or val - k < 0:
                val += k
                parts.append("Let %s = %s + %d." % (names[i], names[i - 1], k))
            else:
                val -= k
                parts.append("Let %s = %s - %d." % (names[i], names[i - 1], k))
        return " ".join(parts) + " What is %s?" % names[-1], str(val)
    raise ValueError(task)


def items(n, seed, exclude=frozenset()):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        task = TASKS[len(out) % len(TASKS)]
        level = 1 + (len(out) // len(TASKS)) % 4
        q, a = make(task, level, rng)
        if q in exclude:
            continue
        out.append({"task": task, "level": level, "q": q, "a": a})
    return out


def chatml(item, answer=True):
    s = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % item["q"]
    return s + item["a"] + "<|im_end|>\n" if answer else s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=200000)
    ap.add_argument("--val", type=int, default=400)
    ap.add_argument("--suite", type=int, default=2, choices=sorted(ADD_RANGES),
                    help="1: the shipped model's suite (addition of 2-6 digits); 2: 1-4 digits; "
                    "3: as 2 with lists of 5-17 items")
    a = ap.parse_args()
    global SUITE
    SUITE = a.suite
    os.makedirs(a.out, exist_ok=True)
    val = items(a.val, 2)
    held = frozenset(x["q"] for x in val)
    train = items(a.train, 1, held)
    with gzip.open(os.path.join(a.out, "tasks_train.jsonl.gz"), "wt") as f:
        for x in train:
            f.write(json.dumps(x) + "\n")
    with open(os.path.join(a.out, "tasks_val.jsonl"), "w") as f:
        for x in val:
            f.write(json.dumps(x) + "\n")
    print("tasks: %d train, %d held-out items in %s" % (len(train), len(val), a.out))


if __name__ == "__main__":
    main()
