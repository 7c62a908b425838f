#!/usr/bin/env python3
"""oracle_plot.py - speculation at 7B scale from bench_spec's oracle runs.

usage: bench/oracle_plot.py [--png OUT.png] [--title T] BENCH_SPEC_OUTPUT.txt

Reads the JSON lines bench_spec prints (one per configuration; --oracle-alpha runs
carry "oracle_alpha") and prints a markdown table of speed-up over the run's own
plain decode (the configuration without a draft) by acceptance alpha, one row per
speculation setting (chain auto, chain k, tree auto, tree N), with the outputs that
differ from target-only as a last column.  With --png, the same as lines of speed-up
against alpha (needs matplotlib: a message and no PNG without it).
"""
import argparse
import json
import sys


def label(d):
    if d["tree_shape"]:
        return "tree %s" % d["tree_shape"]
    if d["tree"]:
        return "tree auto" if d["tree"] < 0 else "tree %d" % d["tree"]
    return "chain auto" if d["k"] == 0 else "chain k=%d" % d["k"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--png")
    ap.add_argument("--title", default="speculation at 7B scale (oracle benchmark mode)")
    ap.add_argument("run")
    a = ap.parse_args()
    rows = []
    with open(a.run) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    plain = [d for d in rows if d["draft"] == "none"]
    if not plain:
        print("oracle_plot: no plain-decode configuration in %s" % a.run, file=sys.stderr)
        return 1
    base = plain[0]["decode_tok_s"]
    alphas = sorted({d["oracle_alpha"] for d in rows if d["draft"] != "none" and d["oracle_alpha"] >= 0})
    series = {}
    differs = {}
    for d in rows:
        if d["draft"] == "none" or d["oracle_alpha"] < 0:
            continue
        series.setdefault(label(d), {})[d["oracle_alpha"]] = d["decode_tok_s"] / base
        differs[label(d)] = differs.get(label(d), 0) + d["differs"]
    print("plain decode: %.1f tok/s\n" % base)
    print("| setting | " + " | ".join("alpha %.1f" % x for x in alphas) + " | outputs unlike target-only |")
    print("|---|" + "---|" * len(alphas) + "---|")
    for name, s in series.items():
        cells = ["%.2fx" % s[x] if x in s else "-" for x in alphas]
        print("| %s | %s | %d |" % (name, " | ".join(cells), differs[name]))
    best = {x: max(s.get(x, 0) for s in series.values()) for x in alphas}
    print("| best | " + " | ".join("%.2fx" % best[x] for x in alphas) + " | |")
    if a.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("oracle_plot: no matplotlib, no PNG", file=sys.stderr)
            return 0
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, s in series.items():
            xs = [x for x in alphas if x in s]
            ax.plot(xs, [s[x] for x in xs], marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("acceptance alpha (oracle: the target's next token first with probability alpha)")
        ax.set_ylabel("speed-up over plain decode")
        ax.set_title(a.title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
