#!/usr/bin/env python3
"""simulate.py - the engine's greedy speculative policy replayed on real traces, to
judge a drafter before building it into the engine.

For every dev prompt: the target's greedy continuation (128 tokens, PyTorch, CPU is
fine) and each drafter's greedy prediction at every position along it.  Along an
accepted path the drafted context equals the true one, so a chain's accepted length
is exact: depth j of a chain drafted at position n is the drafter's prediction from
the true context (a plain draft model: teacher-forced; a feature-conditioned draft
from eagle.py: its pass j).  The policy mirrors src/engine/spec.c: an n-gram proposal
(draft/ngram.c, longest key N) when the context has a match, otherwise the draft
model (with lookup completion after each drafted token).  Time per step comes from
a cost model (--t1, --row, --fwd; defaults from bench_profile on the project's
machine), and the script prints target-only time over speculative time for the
best fixed k of each drafter.

    python3 tools/distill/simulate.py --target T.gguf --draft D.gguf [--fdraft W.npz --init D.gguf]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import Llama, continue_greedy  # noqa: E402


def ngram(toks, n_max, max_out):
    """draft/ngram.c: the most recent earlier match of the last n tokens, n = n_max..2."""
    L = len(toks)
    for n in range(n_max, 1, -1):
        if L < n + 1:
            continue
        key = toks[L - n:]
        for j in range(L - n - 1, -1, -1):
            if toks[j:j + n] == key:
                return toks[j + n:j + n + min(L - (j + n), max_out)]
    return []


def simulate(seqs, n0, pred, kd, kng, N, cost):
    """pred(b, n, j): the drafter's token at depth j (0-based) of a chain drafted
    when seqs[b][:n] is committed, assuming depths < j were accepted."""
    t1, row, fwd = cost
    t_spec = tokens = steps = 0
    for b in range(seqs.shape[0]):
        s = seqs[b].tolist()
        end = len(s)
        for i in range(n0, end):
            if s[i] == 0:  # EOS ends the request
                end = i + 1
                break
        n = n0 + 1  # the prefill produced token n0
        while n < end:
            room = end - n - 1
            prop = ngram(s[:n], N, min(kng, room)) if N else []
            fw = 0
            if not prop:
                for j in range(min(kd, room)):
                    ok = all(prop[q] == s[n + q] for q in range(j))
                    prop.append(pred(b, n, j) if ok else -1)  # -1: off the accepted path
                    fw += 1
                    if N:
                        ext = ngram(s[:n] + [x if x >= 0 else -2 for x in prop], N,
                                    min(max(kd, kng), room) - len(prop))
                        if ext:
                            prop += ext
                            break
            acc = 0
            while acc < len(prop) and n + acc < end and prop[acc] == s[n + acc]:
                acc += 1
            t_spec += t1 + sum(row[:len(prop)]) + fwd * fw
            tokens += acc + 1
            steps += 1
            n += acc + 1
    return tokens * t1 / t_spec, tokens / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", action="append", default=[], help="a draft model GGUF (repeatable)")
    ap.add_argument("--fdraft", default="", help="weights of a feature-conditioned draft (eagle.py)")
    ap.add_argument("--init", default="", help="the GGUF the feature draft started from")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--refs", default="tests/data/refs-dev.jsonl")
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--t1", type=float, default=290.0, help="us per target-only token")
    ap.add_argument("--row", default="35,45,50,50,70,85,90,90,90,90,90,90",
                    help="us for each verified row beyond the first")
    ap.add_argument("--fwd", type=float, default=30.0, help="us per draft-model forward")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cost = (a.t1, [float(v) for v in a.row.split(",")], a.fwd)
    target = Llama(a.target)
    target.requires_grad_(False)
    rows = [json.loads(line) for line in open(a.refs)]
    n0 = len(rows[0]["prompt_ids"])
    pr = torch.tensor([r["prompt_ids"] for r in rows])
    with torch.no_grad():
        seqs = continue_greedy(target, pr, n0 + a.len, len(rows), "cpu")
    preds = {}
    for path in a.draft:
        d = Llama(path)
        with torch.no_grad():
            arg = d(seqs).argmax(-1).numpy()
        preds[os.path.basename(path)] = lambda b, n, j, arg=arg: int(arg[b, n - 1 + j])
    if a.fdraft:
        from eagle import FDraft
        fd = FDraft(Llama(a.init), a.layers, target.dim)
        w = np.load(a.fdraft)
        with torch.no_grad():
            for name in w.files:
                fd.w(name).copy_(torch.from_numpy(w[name]))
            outs = fd.passes(seqs, target.features(seqs), 8)
        arr = np.stack([o.argmax(-1).numpy() for o in outs])  # [pass][B][T]
        preds["fdraft"] = lambda b, n, j, arr=arr: int(arr[j, b, n - 1 + j]) if j < arr.shape[0] else -1
    seqs = seqs.numpy()
    for N in (0, 4):
        for name, pred in preds.items():
            best = max(((simulate(seqs, n0, pred, kd, kng, N, cost), kd, kng)
                        for kd in (2, 3, 4, 5) for kng in ((4, 5, 6) if N else (0,))), key=lambda r: r[0][0])
            (ratio, tps), kd, kng = best
            print("%-28s n-gram %s: %.3f (tokens per step %.2f; best k %d%s)" %
                  (name, N or "off", ratio, tps, kd, ", n-gram k %d" % kng if N else ""), flush=True)


if __name__ == "__main__":
    main()
