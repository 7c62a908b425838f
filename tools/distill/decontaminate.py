#!/usr/bin/env python3
"""decontaminate.py - split the *.py files under ROOT into those a draft may be
trained on and those it may not: a file is dropped when it shares a 50-character
window (whitespace collapsed; windows start at every word of the text) with any
prompt or reference text of the dev prompts, the benchmark's text.  Files under
200 characters are left out of both lists.

    python3 tools/distill/decontaminate.py ROOT tests/data/prompts-dev.jsonl OUT.json

OUT.json: {"keep": [...], "drop": [...]} (make_corpus.py --files reads "keep").
"""
import json
import os
import re
import sys

WINDOW = 50


def norm(text):
    return re.sub(r"\s+", " ", text)


def dev_windows(prompts_path):
    """Every WINDOW-character window of the dev texts that starts at a word."""
    wins = set()
    for line in open(prompts_path):
        d = json.loads(line)
        for text in (d["prompt"], d["reference"]):
            n = norm(text)
            for m in re.finditer(r"(?:^| )\S", n):
                w = n[m.start():m.start() + WINDOW + 10].strip()[:WINDOW]
                if len(w) == WINDOW:
                    wins.add(w)
    return wins


def main():
    root, prompts, out = sys.argv[1:4]
    wins = dev_windows(prompts)
    by_head = {}  # first 12 characters -> windows: one substring test rules out many
    for w in wins:
        by_head.setdefault(w[:12], []).append(w)
    keep, drop = [], []
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".py"))
    for f in files:
        text = open(f, encoding="utf-8", errors="replace").read()
        if len(text) < 200:
            continue
        n = norm(text)
        hit = any(head in n and any(w in n for w in ws) for head, ws in by_head.items())
        (drop if hit else keep).append(f)
    print("%d dev windows; kept %d files, dropped %d" % (len(wins), len(keep), len(drop)))
    with open(out, "w") as fh:
        json.dump({"keep": keep, "drop": drop}, fh)


if __name__ == "__main__":
    main()
