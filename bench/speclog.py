#!/usr/bin/env python3
"""speclog.py - summarises a scheduler log (TANDEM_SCHED_LOG=1 on stderr of tandem,
bench_spec or bench_batch): where a lone sequence's (or a batch's) steps went.

Per kind of step (a lookup step: n-gram lookups alone; a model chain; a model chain
extended by lookups) the steps, tokens proposed and accepted, and the drafting and
verification milliseconds; the length controller's decisions per batch size (how
often each k, trials among them); and the last decision's measured step costs.
Several logs side by side (say an old build's and a new one's): one column each.

usage: bench/speclog.py LOG [LOG ...]     (.xz files are read too)
"""
import collections
import lzma
import re
import sys

# (old builds logged a lone sequence's steps as "lone: k ...", without the request)
STEP = re.compile(r"(?:step: request (\d+), |lone: )k (\d+), proposed (\d+) \(model (\d+), looked up (\d+)(, a lookup step)?\), "
                  r"accepted (\d+); alpha ([\d.]+), lookups' ([\d.]+); ms ([\d.]+) \+ ([\d.]+)")
LEN = re.compile(r"len: batch (\d+) \(\+(\d+) rows\) k_max (\d+) -> k (\d+)( \(trial\))?.*?step ms:([\d. ]+);")


def read(path):
    op = lzma.open if path.endswith(".xz") else open
    with op(path, "rt", errors="replace") as f:
        return f.read().splitlines()


def summarise(lines):
    kinds = collections.OrderedDict((k, [0, 0, 0, 0.0, 0.0]) for k in ("lookup", "model", "model+lookup"))
    decisions = collections.defaultdict(collections.Counter)
    trials = collections.Counter()
    last_costs = {}
    for l in lines:
        m = STEP.search(l)
        if m:
            prop, model, look, acc = int(m[3]), int(m[4]), int(m[5]), int(m[7])
            kind = "lookup" if m[6] else ("model+lookup" if look > 0 else "model")
            row = kinds[kind]
            row[0] += 1
            row[1] += prop
            row[2] += acc
            row[3] += float(m[10])
            row[4] += float(m[11])
            continue
        m = LEN.search(l)
        if m:
            b, k = int(m[1]), int(m[4])
            decisions[b][k] += 1
            if m[5]:
                trials[b] += 1
            last_costs[b] = [float(x) for x in m[6].split()]
    return kinds, decisions, trials, last_costs


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in sys.argv[1:]:
        kinds, decisions, trials, costs = summarise(read(path))
        print(f"== {path}")
        n_all = sum(r[0] for r in kinds.values())
        acc_all = sum(r[2] for r in kinds.values())
        ms_all = sum(r[3] + r[4] for r in kinds.values())
        print(f"{'kind':<14}{'steps':>8}{'proposed':>10}{'accepted':>10}{'acc/step':>10}{'draft ms':>10}{'verify ms':>11}")
        for k, (n, p, a, d, v) in kinds.items():
            print(f"{k:<14}{n:>8}{p:>10}{a:>10}{(a / n if n else 0):>10.2f}{d:>10.1f}{v:>11.1f}")
        if n_all:
            print(f"all: {n_all} steps, {acc_all} accepted, {(acc_all + n_all) / n_all:.2f} tokens a step, "
                  f"{ms_all:.1f} ms in steps ({ms_all / (acc_all + n_all):.3f} ms a token)")
        for b in sorted(decisions):
            c = decisions[b]
            tot = sum(c.values())
            ks = " ".join(f"k{k}:{c[k]}" for k in sorted(c))
            print(f"batch {b}: {tot} decisions ({trials[b]} trials): {ks}")
            print(f"  last step ms by k: {' '.join(f'{x:.3f}' for x in costs[b])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
