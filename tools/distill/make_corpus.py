#!/usr/bin/env python3
"""make_corpus.py - token ids of real Python code for distill.py --corpus: the
modules of this machine's Python standard library (tests, idlelib, lib2to3 and
site-packages left out), in a shuffled order, each after a BOS (id 0), tokenized
with tandem's own tokenizer, until about 3 M tokens.

    python3 tools/distill/make_corpus.py TANDEM_BIN MODEL.gguf OUT.npy [LIBDIR]
"""
import json
import os
import random
import subprocess
import sys

import numpy as np


def main():
    tandem, model, out = sys.argv[1:4]
    root = sys.argv[4] if len(sys.argv) > 4 else "/usr/lib/python3.11"
    skip = ("/test", "/tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo")
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) if not any(x in d for x in skip)
                   for f in fs if f.endswith(".py"))
    random.Random(0).shuffle(files)
    parts, total = [], 0
    for f in files:
        text = open(f, encoding="utf-8", errors="replace").read()
        if len(text) < 200:
            continue
        r = subprocess.run([tandem, "tokenize", "-m", model, "--no-bos"], input=text.encode(), capture_output=True)
        if r.returncode:
            continue
        ids = json.loads(r.stdout)
        parts.append(np.array([0] + ids, dtype=np.uint16))
        total += len(ids)
        if total > 3_000_000:
            break
    arr = np.concatenate(parts)
    np.save(out, arr)
    print("%d files, %d tokens -> %s" % (len(parts), len(arr), out))


if __name__ == "__main__":
    main()
