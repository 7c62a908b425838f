#!/usr/bin/env python3
"""real_pair_plot.py - the real pair's side-by-side bench (bench/real_pair.sh) as a PNG.

usage: bench/real_pair_plot.py REAL-PAIR.json OUT.png

Two panels from the medians: tok/s of prefill, plain decode and speculative decode
(llama.cpp beside tandem, each round's samples as dots), and peak RSS of the plain and
speculative runs.  Needs matplotlib (a message and no PNG without it).
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    res = json.load(open(sys.argv[1]))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("real_pair_plot: matplotlib missing: no %s" % sys.argv[2], file=sys.stderr)
        return 0
    med, rows = res["median"], res["samples"]
    engines = (("llama.cpp", "#888888"), ("tandem", "#1f77b4"))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    speed = (("prefill", "plain", "pp"), ("plain decode", "plain", "tg"), ("speculative decode", "spec", "tg"))
    mem = (("plain", "plain"), ("speculative", "spec"))
    for ax, items, key_of, unit in ((a1, speed, lambda it: it[2], "tok/s"), (a2, mem, lambda it: "rss_mb", "MB")):
        for j, (eng, color) in enumerate(engines):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(items))]
            vals = [med["%s %s" % (eng, it[1])][key_of(it)] for it in items]
            ax.bar(xs, vals, width=0.36, color=color, label=eng)
            for x, it in zip(xs, items):
                pts = [r[key_of(it)] for r in rows if r["engine"] == eng and r["work"] == it[1]]
                ax.plot([x] * len(pts), pts, "k.", markersize=4)
            for x, v in zip(xs, vals):
                ax.annotate("%.0f" % v if unit == "MB" or v >= 100 else "%.1f" % v, (x, v), ha="center",
                            va="bottom", fontsize=8)
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels([it[0] for it in items])
        ax.set_ylabel(unit)
        ax.legend()
    a1.set_title("speed (median of %d round%s; dots: each round)" % (res["rounds"], "" if res["rounds"] == 1 else "s"))
    a2.set_title("peak RSS")
    fig.suptitle("%s + %s, CPU, %d threads (%s)" % (res["target"], res["draft"], res["threads"], res["date"]),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
