#!/usr/bin/env python3
"""gpu_summary.py - the summary of a bench/gpu.sh run: reads the run folder's
tandem-*.json (tandem bench --json), llama-*.json (llama-bench -o json) and spec.txt
(bench_spec), writes summary.json and decode.png there and prints the markdown table.

usage: gpu_summary.py RUN_DIR
"""
import json
import os
import sys

# (file stem, model label, type label), in table order
MODELS = [
    ("llama2-7b-f16", "Llama-2-7B shapes", "F16"),
    ("llama2-7b-q8_0", "Llama-2-7B shapes", "Q8_0"),
    ("llama2-7b-q4_0", "Llama-2-7B shapes", "Q4_0"),
    ("llama3-8b-f16", "Llama-3-8B shapes", "F16"),
    ("pycode-target", "pycode target (15.7 M)", "F16"),
]
BANDWIDTH_GB_S = 4300.0  # H200 device-to-device copy (bytes read + written), as measured


def load_json(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def llama_rates(rows):
    """(prefill tok/s, decode tok/s) from llama-bench's JSON rows."""
    pp = tg = None
    for r in rows or []:
        if r.get("n_gen", 0) == 0 and r.get("n_prompt", 0) > 0:
            pp = r.get("avg_ts")
        elif r.get("n_prompt", 0) == 0 and r.get("n_gen", 0) > 0:
            tg = r.get("avg_ts")
    return pp, tg


def spec_rows(path):
    """bench_spec's JSON lines: {draft, k, ngram, decode_tok_s, ...}."""
    rows = []
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    except (OSError, ValueError):
        pass
    return rows


def fmt(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    run = sys.argv[1]
    summary = {"run": os.path.abspath(run), "models": [], "spec": []}
    for stem, label, typ in MODELS:
        t = load_json(os.path.join(run, f"tandem-{stem}.json"))
        l = load_json(os.path.join(run, f"llama-{stem}.json"))
        lp, lt = llama_rates(l if isinstance(l, list) else None)
        row = {
            "model": label, "type": typ, "file": stem,
            "tandem_prefill": t.get("prefill_tok_s") if t else None,
            "tandem_decode": t.get("decode_tok_s") if t else None,
            "tandem_decode_gb_s": t.get("decode_gb_s") if t else None,
            "tandem_peak_gpu_mb": t.get("peak_gpu_mb") if t else None,
            "prompt_tokens": t.get("prompt_tokens") if t else None,
            "llama_prefill": lp, "llama_decode": lt,
        }
        row["decode_ratio"] = ratio(row["tandem_decode"], lt)
        row["prefill_ratio"] = ratio(row["tandem_prefill"], lp)
        summary["models"].append(row)
    spec = spec_rows(os.path.join(run, "spec.txt"))
    plain = next((r["decode_tok_s"] for r in spec if r.get("draft") == "none"), None)
    for r in spec:
        if r.get("draft") != "none":
            summary["spec"].append({"draft": os.path.basename(r["draft"]), "k": r["k"], "ngram": r["ngram"],
                                    "decode_tok_s": r["decode_tok_s"], "plain_tok_s": plain,
                                    "speedup": ratio(r["decode_tok_s"], plain),
                                    "acceptance": r.get("acceptance_rate")})
    with open(os.path.join(run, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    print("| model | type | work | llama.cpp tok/s | tandem tok/s | tandem / llama.cpp | achieved bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in summary["models"]:
        bw = r["tandem_decode_gb_s"]
        bw_s = "—" if bw is None else f"{bw:,.0f} GB/s ({100 * bw / BANDWIDTH_GB_S:.0f} % of 4.3 TB/s)"
        print(f"| {r['model']} | {r['type']} | decode, batch 1 | {fmt(r['llama_decode'])} | {fmt(r['tandem_decode'])} "
              f"| {fmt(r['decode_ratio'], 2)}x | {bw_s} |")
        if r["prompt_tokens"] and r["prompt_tokens"] >= 512:
            print(f"| {r['model']} | {r['type']} | prefill {int(r['prompt_tokens'])} | {fmt(r['llama_prefill'], 0)} "
                  f"| {fmt(r['tandem_prefill'], 0)} | {fmt(r['prefill_ratio'], 2)}x | |")
    for s in summary["spec"]:
        print(f"| pycode target + {s['draft']} | F16 | speculative, greedy, k {'auto' if s['k'] == 0 else s['k']}"
              f", n-gram {s['ngram']} | — | {fmt(s['decode_tok_s'])} | {fmt(s['speedup'], 2)}x own plain "
              f"({fmt(s['plain_tok_s'])}) | |")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib missing: no decode.png)", file=sys.stderr)
        return
    rows = [r for r in summary["models"] if r["tandem_decode"] or r["llama_decode"]]
    if not rows:
        return
    labels = [f"{r['model'].replace(' shapes', '')}\n{r['type']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4.2))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [r["llama_decode"] or 0 for r in rows], w, label="llama.cpp", color="#999999")
    ax.bar([i + w / 2 for i in x], [r["tandem_decode"] or 0 for r in rows], w, label="tandem", color="#1f77b4")
    for i, r in enumerate(rows):
        for v, dx in ((r["llama_decode"], -w / 2), (r["tandem_decode"], w / 2)):
            if v:
                ax.text(i + dx, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("decode tok/s (batch 1)")
    ax.set_yscale("log")
    ax.set_title("Decode speed on one H200, same files, same run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(run, "decode.png"), dpi=120)


if __name__ == "__main__":
    main()
