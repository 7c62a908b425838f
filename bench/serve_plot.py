#!/usr/bin/env python3
"""serve_plot.py - tables and a plot from bench/serve_bench.py's JSON files.

usage: bench/serve_plot.py [--png OUT.png] [--x concurrency|throughput] RUN.json...

Prints markdown (for bench/RESULTS.md): one table per configuration (a row per
concurrency; "speculated": the share of output tokens that came from speculative
steps, absent in older files), then, for every backend with both pycode-spec-B and pycode-plain-B, the
speculation on / off comparison and issue 21's goal (p50 TPOT at concurrency 1 at least
2x lower with speculation; output throughput at concurrency 32 no lower).  With --png,
p50 TPOT, p50 TTFT and output throughput against concurrency (or against the
achieved output throughput: --x throughput), one line per configuration; needs
matplotlib (a message and no PNG without it).
"""
import argparse
import json
import sys


def load(paths):
    cfgs = []
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            print("serve_plot: %s: %s" % (p, e), file=sys.stderr)
            continue
        if "runs" not in d:
            continue
        runs = sorted(d["runs"], key=lambda r: (r["request_rate"] or 0, r["concurrency"]))
        cfgs.append({"label": d.get("label") or p, "meta": d, "runs": runs})
    return cfgs


def fmt(v, d=2):
    if v is None:
        return "—"
    return "{:,.{d}f}".format(v, d=d)


def conc_name(r):
    c = "inf" if r["concurrency"] <= 0 else str(r["concurrency"])
    return c if r["request_rate"] is None else "%s @ %g req/s" % (c, r["request_rate"])


def table(cfg):
    m = cfg["meta"]
    lines = ["**%s** — %d requests per run, max_tokens %d, temperature %g, %s" %
             (cfg["label"], m["num_prompts"], m["max_tokens"], m["temperature"], m["endpoint"]),
             "",
             "| concurrency | req/s | output tok/s | TTFT p50 / p99 ms | TPOT mean / p50 / p90 / p99 ms "
             "| ITL p50 / p99 ms (per chunk) | ITL/token p50 ms | E2E p50 ms | tokens/chunk | speculated | failed |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in cfg["runs"]:
        s = r["summary"]
        t = s["tpot_ms"]
        sp = (s.get("spec") or {}).get("speculative_share")
        lines.append("| %s | %s | %s | %s / %s | %s / %s / %s / %s | %s / %s | %s | %s | %s | %s | %d |" % (
            conc_name(r), fmt(s["request_throughput"]), fmt(s["output_throughput"], 1),
            fmt(s["ttft_ms"]["p50"]), fmt(s["ttft_ms"]["p99"]),
            fmt(t["mean"]), fmt(t["p50"]), fmt(t["p90"]), fmt(t["p99"]),
            fmt(s["itl_ms"]["p50"]), fmt(s["itl_ms"]["p99"]), fmt(s["itl_token_ms"]["p50"]),
            fmt(s["e2e_ms"]["p50"], 1), fmt(s["tokens_per_chunk"]), "—" if sp is None else "%.0f %%" % (100 * sp),
            s["failed"]))
    return "\n".join(lines)


def compare(cfgs):
    by = {c["label"]: c for c in cfgs}
    out = []
    for label in sorted(by):
        if not label.startswith("pycode-spec-"):
            continue
        b = label[len("pycode-spec-"):]
        off = by.get("pycode-plain-" + b)
        if not off:
            continue
        on_runs = {r["concurrency"]: r["summary"] for r in by[label]["runs"] if r["request_rate"] is None}
        off_runs = {r["concurrency"]: r["summary"] for r in off["runs"] if r["request_rate"] is None}
        out += ["**pycode pair on %s, speculation on / off** (ratios > 1: speculation better)" % b, "",
                "| concurrency | p50 TPOT off / on ms | TPOT speed-up | output tok/s off / on | throughput ratio | p50 TTFT off / on ms |",
                "|---:|---:|---:|---:|---:|---:|"]
        for c in sorted(set(on_runs) & set(off_runs)):
            a, z = off_runs[c], on_runs[c]
            ta, tz = a["tpot_ms"]["p50"], z["tpot_ms"]["p50"]
            qa, qz = a["output_throughput"], z["output_throughput"]
            out.append("| %s | %s / %s | %s | %s / %s | %s | %s / %s |" % (
                c if c > 0 else "inf", fmt(ta), fmt(tz), (fmt(ta / tz) + "x") if ta and tz else "—",
                fmt(qa, 1), fmt(qz, 1), (fmt(qz / qa) + "x") if qa and qz else "—",
                fmt(a["ttft_ms"]["p50"]), fmt(z["ttft_ms"]["p50"])))
        goal = []
        if 1 in on_runs and 1 in off_runs and on_runs[1]["tpot_ms"]["p50"] and off_runs[1]["tpot_ms"]["p50"]:
            x = off_runs[1]["tpot_ms"]["p50"] / on_runs[1]["tpot_ms"]["p50"]
            goal.append("p50 TPOT at concurrency 1: %.2fx lower with speculation (goal >= 2x: %s)" % (x, "met" if x >= 2 else "not met"))
        if 32 in on_runs and 32 in off_runs and on_runs[32]["output_throughput"] and off_runs[32]["output_throughput"]:
            x = on_runs[32]["output_throughput"] / off_runs[32]["output_throughput"]
            goal.append("output throughput at concurrency 32: %.2fx of without (goal >= 1x: %s)" % (x, "met" if x >= 1 else "not met"))
        if goal:
            out += [""] + ["- " + g for g in goal]
        out.append("")
    return "\n".join(out)


def plot(cfgs, png, xmode):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("serve_plot: matplotlib missing: no %s" % png, file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    panels = (("p50 time per output token (ms)", lambda s: s["tpot_ms"]["p50"]),
              ("p50 time to first token (ms)", lambda s: s["ttft_ms"]["p50"]),
              ("output token throughput (tok/s)", lambda s: s["output_throughput"]))
    for ax, (title, get) in zip(axes, panels):
        for cfg in cfgs:
            runs = [r for r in cfg["runs"] if r["request_rate"] is None and r["concurrency"] > 0]
            pts = []
            for r in runs:
                x = r["concurrency"] if xmode == "concurrency" else r["summary"]["output_throughput"]
                y = get(r["summary"])
                if x is not None and y is not None:
                    pts.append((x, y))
            if not pts:
                continue
            if xmode == "concurrency":
                pts.sort()
            style = "-" if "spec" in cfg["label"] else "--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=cfg["label"])
        ax.set_xscale("log", base=2 if xmode == "concurrency" else 10)
        if xmode == "concurrency":
            cs = sorted({r["concurrency"] for cfg in cfgs for r in cfg["runs"] if r["concurrency"] > 0})
            ax.set_xticks(cs)
            ax.set_xticklabels([str(c) for c in cs])
        if "throughput" not in title:
            ax.set_yscale("log")
        ax.set_xlabel("concurrency (requests in flight)" if xmode == "concurrency" else "achieved output tok/s")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    m = cfgs[0]["meta"]
    fig.suptitle("tandem serve under load (bench/serve_bench.py: %d requests, max_tokens %d, streamed)" %
                 (m["num_prompts"], m["max_tokens"]), fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("serve_plot: wrote %s" % png, file=sys.stderr)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png")
    ap.add_argument("--x", default="concurrency", choices=["concurrency", "throughput"])
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    cfgs = load(a.json)
    if not cfgs:
        print("serve_plot: no serve_bench results among the files", file=sys.stderr)
        return 1
    for c in cfgs:
        print(table(c) + "\n")
    cmp = compare(cfgs)
    if cmp:
        print(cmp)
    if a.png:
        plot(cfgs, a.png, a.x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
