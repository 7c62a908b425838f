#!/usr/bin/env python3
"""make_corpus.py - token ids of real Python code for distill.py --corpus: Python
files in a shuffled order, each after a BOS (id 0), tokenized with tandem's own
tokenizer, until a token budget is reached.

    python3 tools/distill/make_corpus.py TANDEM_BIN MODEL.gguf OUT.npy [ROOT] [--max-tokens N]
    python3 tools/distill/make_corpus.py TANDEM_BIN MODEL.gguf OUT.npy --files LIST.json [--max-tokens N]

ROOT (default: this machine's Python standard library, tests, idlelib, lib2to3 and
site-packages left out) is walked for *.py files; --files takes a JSON object whose
"keep" list names the files instead (the output of decontaminate.py).
"""
import argparse
import json
import os
import random
import subprocess

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tandem")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("root", nargs="?", default="/usr/lib/python3.11")
    ap.add_argument("--files", default="", help="JSON object with a 'keep' list of files")
    ap.add_argument("--max-tokens", type=int, default=3_000_000)
    a = ap.parse_args()
    if a.files:
        files = sorted(json.load(open(a.files))["keep"])
    else:
        skip = ("/test", "/tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo")
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.root) if not any(x in d for x in skip)
                       for f in fs if f.endswith(".py"))
    random.Random(0).shuffle(files)
    parts, total = [], 0
    for f in files:
        text = open(f, encoding="utf-8", errors="replace").read()
        if len(text) < 200:
            continue
        r = subprocess.run([a.tandem, "tokenize", "-m", a.model, "--no-bos"], input=text.encode(),
                           capture_output=True)
        if r.returncode:
            continue
        ids = json.loads(r.stdout)
        parts.append(np.array([0] + ids, dtype=np.uint16))
        total += len(ids)
        if total > a.max_tokens:
            break
    arr = np.concatenate(parts)
    np.save(a.out, arr)
    print("%d files, %d tokens -> %s" % (len(parts), len(arr), a.out))


if __name__ == "__main__":
    main()
