#!/usr/bin/env python3
"""batch_summary.py - the batched-throughput part of a bench/gpu.sh run (its batch step).

usage:
  batch_summary.py BATCH_DIR
      reads BATCH_DIR/tandem-*.json (bench_batch --json) and llama-*.json (made by
      parse-llama), prints markdown tables (tandem against llama.cpp per batch size,
      speculation on/off), writes BATCH_DIR/batch-summary.json and, with matplotlib,
      BATCH_DIR/batch.png (throughput and per-request latency against the batch size,
      both engines).
  batch_summary.py parse-llama --out OUT.json [--command CMD] RAW...
      llama-batched-bench's output (the markdown table or --output-format jsonl), one
      file per repetition, into OUT.json: every row and the median per batch size.
  batch_summary.py selftest
      the parser on a sample of llama-batched-bench's real output and the summary on
      made-up files in a temporary folder.

Figures: tandem's S_TG is bench_batch's (see its header comment), llama.cpp's is its
S_TG column (B * TG / T_TG).  A llama.cpp request's latency is the whole T (every
sequence of its batch finishes at the end), its time per output token T_TG / TG.
"""
import glob
import json
import os
import statistics
import sys
import tempfile

LLAMA_COLS = ["pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"]
SPEC_FLOOR = 0.97  # speculation on may be at most 3 % below off
GOAL = (64, 10000.0)  # batch 64: 10,000 tok/s


def parse_llama_lines(lines):
    """Rows of llama-batched-bench output: dicts with LLAMA_COLS keys (numbers).
    Takes JSON lines and markdown table rows; skips everything else."""
    rows = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if all(k in d for k in LLAMA_COLS):
                rows.append({k: d[k] for k in LLAMA_COLS})
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) != len(LLAMA_COLS):
                continue
            try:
                vals = [float(c) for c in cells]
            except ValueError:
                continue  # the header or the separator
            rows.append({k: (int(v) if k in ("pp", "tg", "pl", "n_kv") else v) for k, v in zip(LLAMA_COLS, vals)})
    return rows


def llama_medians(reps):
    """Per (pp, tg, pl): the median of each figure over the repetitions."""
    by = {}
    for rows in reps:
        for r in rows:
            by.setdefault((r["pp"], r["tg"], r["pl"]), []).append(r)
    out = []
    for key in sorted(by):
        rs = by[key]
        m = {k: statistics.median(r[k] for r in rs) for k in LLAMA_COLS[3:]}
        m.update({"pp": key[0], "tg": key[1], "pl": key[2], "n_reps": len(rs)})
        out.append(m)
    return out


def parse_llama(argv):
    out, command, raws = None, None, []
    it = iter(argv)
    for a in it:
        if a == "--out":
            out = next(it, None)
        elif a == "--command":
            command = next(it, None)
        else:
            raws.append(a)
    if not out or not raws:
        print("usage: batch_summary.py parse-llama --out OUT.json [--command CMD] RAW...", file=sys.stderr)
        return 2
    reps = []
    for path in raws:
        try:
            with open(path) as f:
                rows = parse_llama_lines(f)
        except OSError as e:
            print(f"warning: {path}: {e}", file=sys.stderr)
            continue
        if rows:
            reps.append(rows)
        else:
            print(f"warning: {path}: no llama-batched-bench rows", file=sys.stderr)
    doc = {"tool": "llama-batched-bench", "command": command, "files": raws, "reps": reps,
           "median": llama_medians(reps),
           "definitions": {"speed_tg": "pl * tg / t_tg", "speed_pp": "pl * pp / t_pp", "speed": "n_kv / t"}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0 if reps else 1


# ------------------------------------------------------------------------ summary

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"warning: {path}: {e}", file=sys.stderr)
        return None


def load_opt(path):
    """load, or None without a warning when the file is not there (its step did not run)."""
    return load(path) if os.path.exists(path) else None


def fmt(v, digits=1, unit=""):
    return "—" if v is None else f"{v:,.{digits}f}{unit}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def tandem_rows(doc, spec):
    """bench_batch's runs with the given speculation setting, by batch size (medians)."""
    return {r["batch"]: r["median"] for r in doc.get("runs", []) if r.get("spec") == spec}


def compare(tandem, llama):
    """Rows of the tandem / llama.cpp table."""
    t = tandem_rows(tandem, False) if tandem else {}
    l = {r["pl"]: r for r in llama.get("median", [])} if llama else {}
    rows = []
    for b in sorted(set(t) | set(l)):
        tr, lr = t.get(b, {}), l.get(b)
        rows.append({
            "batch": b,
            "llama_s_tg": lr["speed_tg"] if lr else None,
            "tandem_s_tg": tr.get("s_tg"),
            "llama_s_pp": lr["speed_pp"] if lr else None,
            "tandem_s_pp": tr.get("s_pp"),
            "llama_s_total": lr["speed"] if lr else None,
            "tandem_s_total": tr.get("s_total"),
            "llama_latency_s": lr["t"] if lr else None,
            "llama_tpot_ms": 1e3 * lr["t_tg"] / lr["tg"] if lr else None,
            "tandem_e2e_median_s": tr.get("e2e_median_s"),
            "tandem_e2e_p90_s": tr.get("e2e_p90_s"),
            "tandem_tpot_median_ms": tr.get("tpot_median_ms"),
            "tandem_ttft_median_ms": tr.get("ttft_median_ms"),
        })
        rows[-1]["s_tg_ratio"] = ratio(rows[-1]["tandem_s_tg"], rows[-1]["llama_s_tg"])
    return rows


def spec_rows(doc):
    off, on = tandem_rows(doc, False), tandem_rows(doc, True)
    reps = {r["batch"]: r.get("s_tg_on_off_reps") for r in doc.get("spec_ratio", [])}
    rows = []
    for b in sorted(set(off) & set(on)):
        rows.append({"backend": doc.get("backend"), "batch": b,
                     "s_tg_off": off[b].get("s_tg"), "s_tg_on": on[b].get("s_tg"),
                     "s_tg_on_off": ratio(on[b].get("s_tg"), off[b].get("s_tg")),
                     "s_tg_on_off_reps": reps.get(b),
                     "s_total_on_off": ratio(on[b].get("s_total"), off[b].get("s_total")),
                     "acceptance": on[b].get("acceptance")})
    return rows


def print_compare(label, rows, out):
    print(f"Batched generation, {label}: 128-token prompts, 128 new tokens, greedy "
          "(S_TG: generation-phase tok/s; latency: a request's end-to-end time)\n", file=out)
    print("| batch | llama.cpp S_TG | tandem S_TG | tandem / llama.cpp | llama.cpp S_PP | tandem S_PP "
          "| llama.cpp latency s | tandem latency median / p90 s | llama.cpp / tandem TPOT ms |", file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r['batch']} | {fmt(r['llama_s_tg'])} | {fmt(r['tandem_s_tg'])} | {fmt(r['s_tg_ratio'], 2, 'x')} "
              f"| {fmt(r['llama_s_pp'], 0)} | {fmt(r['tandem_s_pp'], 0)} | {fmt(r['llama_latency_s'], 2)} "
              f"| {fmt(r['tandem_e2e_median_s'], 2)} / {fmt(r['tandem_e2e_p90_s'], 2)} "
              f"| {fmt(r['llama_tpot_ms'], 2)} / {fmt(r['tandem_tpot_median_ms'], 2)} |", file=out)
    both = [r for r in rows if r["s_tg_ratio"] is not None]
    if both:
        ahead = all(r["s_tg_ratio"] > 1 for r in both)
        print(f"\nFloor (tandem ahead of llama.cpp at every batch size): {'met' if ahead else 'NOT met'} "
              f"(lowest ratio {min(r['s_tg_ratio'] for r in both):.2f}x).", file=out)
    goal = next((r for r in rows if r["batch"] == GOAL[0] and r["tandem_s_tg"] is not None), None)
    if goal:
        print(f"Goal ({GOAL[1]:,.0f} tok/s at batch {GOAL[0]}): {goal['tandem_s_tg']:,.0f} tok/s "
              f"({100 * goal['tandem_s_tg'] / GOAL[1]:.0f} %).", file=out)


def print_spec(rows, out):
    print("\nSpeculation in a batch, pycode target + draft (real prompts; on / off from the same run, "
          f"floor {SPEC_FLOOR:.2f})\n", file=out)
    print("| backend | batch | S_TG off | S_TG on | on / off | per repetition | S_total on / off | acceptance | floor |",
          file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        reps = r["s_tg_on_off_reps"]
        rs = "—" if not reps else f"{min(reps):.3f}-{max(reps):.3f}"
        ok = r["s_tg_on_off"] is not None and r["s_tg_on_off"] >= SPEC_FLOOR
        print(f"| {r['backend']} | {r['batch']} | {fmt(r['s_tg_off'])} | {fmt(r['s_tg_on'])} "
              f"| {fmt(r['s_tg_on_off'], 3)} | {rs} | {fmt(r['s_total_on_off'], 3)} "
              f"| {fmt(r['acceptance'], 3)} | {'ok' if ok else 'BELOW'} |", file=out)


def plot(rows, label, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no batch.png)", file=sys.stderr)
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = (("llama.cpp", "llama_s_tg", "llama_latency_s", None, "#999999", "s--"),
              ("tandem", "tandem_s_tg", "tandem_e2e_median_s", "tandem_e2e_p90_s", "#1f77b4", "o-"))
    for name, tg, lat, p90, color, style in series:
        pts = [(r["batch"], r[tg]) for r in rows if r[tg] is not None]
        if pts:
            ax1.plot(*zip(*pts), style, color=color, label=name)
            for x, y in pts:
                ax1.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center",
                             fontsize=7, color=color)
        pts = [(r["batch"], r[lat]) for r in rows if r[lat] is not None]
        if pts:
            ax2.plot(*zip(*pts), style, color=color, label=f"{name} (median)" if p90 else name)
        if p90:
            pts = [(r["batch"], r[p90]) for r in rows if r[p90] is not None]
            if pts:
                ax2.plot(*zip(*pts), ":", color=color, label=f"{name} (p90)")
    ax1.axhline(GOAL[1], color="#2ca02c", lw=0.8, ls=":", label=f"goal {GOAL[1]:,.0f} tok/s (batch {GOAL[0]})")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["batch"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("batch size (concurrent requests)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("generation throughput S_TG (tok/s, log)")
    ax1.set_title("Throughput", fontsize=10)
    ax2.set_ylabel("per-request latency, end to end (s)")
    ax2.set_title("Latency (128 + 128 tokens)", fontsize=10)
    fig.suptitle(f"{label}, same GPU, same run", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summarize(batch_dir, out=sys.stdout):
    tandem = load_opt(os.path.join(batch_dir, "tandem-llama2-7b-f16.json"))
    llama = load_opt(os.path.join(batch_dir, "llama-llama2-7b-f16.json"))
    label = "Llama-2-7B shapes, F16"
    summary = {"dir": os.path.abspath(batch_dir), "model": label,
               "tandem_command": tandem.get("command") if tandem else None,
               "tandem_date": tandem.get("date") if tandem else None,
               "gpu": tandem.get("gpu") if tandem else None,
               "llama_command": llama.get("command") if llama else None,
               "compare": compare(tandem, llama), "spec": []}
    if summary["compare"]:
        print_compare(label, summary["compare"], out)
    # the same with batch_invariant on (bench_batch --invariant): every row computed as alone
    inv = load_opt(os.path.join(batch_dir, "tandem-llama2-7b-f16-invariant.json"))
    summary["compare_invariant"] = compare(inv, llama) if inv else []
    if summary["compare_invariant"]:
        print_compare(label + ", batch_invariant on", summary["compare_invariant"], out)
    for path in sorted(glob.glob(os.path.join(batch_dir, "tandem-*.json"))):
        doc = load(path)
        if doc and doc.get("draft") and not path.endswith("-invariant.json"):
            summary["spec"] += spec_rows(doc)
    if summary["spec"]:
        print_spec(summary["spec"], out)
    with open(os.path.join(batch_dir, "batch-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if summary["compare"] and plot(summary["compare"], label, os.path.join(batch_dir, "batch.png")):
        print("\n![throughput and latency against the batch size](batch/batch.png)", file=out)
    if summary["compare_invariant"] and plot(summary["compare_invariant"], label + ", batch_invariant on",
                                             os.path.join(batch_dir, "batch-invariant.png")):
        print("\n![the same, batch_invariant on](batch/batch-invariant.png)", file=out)
    return summary


# ----------------------------------------------------------------------- selftest

# llama-batched-bench's stdout, markdown form (examples/batched-bench/batched-bench.cpp's
# format strings; the rows are the README's sample results)
SAMPLE_MD = """
main: n_kv_max = 40192, n_batch = 2048, n_ubatch = 512, flash_attn = 0, is_pp_shared = 0, n_gpu_layers = 99, n_threads = 16, n_threads_batch = 16

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |    1 |    256 |    0.108 |  1186.64 |    3.079 |    41.57 |    3.187 |    80.32 |
|   128 |    128 |    2 |    512 |    0.198 |  1295.19 |    5.029 |    50.90 |    5.227 |    97.95 |
|   128 |    128 |    8 |   2048 |    0.751 |  1363.27 |    7.344 |   139.43 |    8.095 |   252.99 |
"""
# its --output-format jsonl form (the README's sample)
SAMPLE_JSONL = """
{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 8, "n_threads_batch": 8, "pp": 128, "tg": 128, "pl": 1, "n_kv": 256, "t_pp": 0.233810, "speed_pp": 547.453064, "t_tg": 3.503684, "speed_tg": 36.532974, "t": 3.737494, "speed": 68.495094}
{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 8, "n_threads_batch": 8, "pp": 128, "tg": 128, "pl": 2, "n_kv": 512, "t_pp": 0.422602, "speed_pp": 605.770935, "t_tg": 11.106112, "speed_tg": 23.050371, "t": 11.528713, "speed": 44.410854}
"""


def fake_bench_batch(batches, spec, backend, scale):
    runs, ratios = [], []
    for b in batches:
        for on in ([False, True] if spec else [False]):
            s_tg = scale * b / (1 + b / 64) * (0.99 if on else 1.0)
            m = {"s_pp": 20 * s_tg, "s_tg": s_tg, "s_total": 1.8 * s_tg, "e2e_median_s": 256 * b / s_tg,
                 "e2e_p90_s": 270 * b / s_tg, "tpot_median_ms": 1e3 * b / s_tg, "ttft_median_ms": 5.0 * b,
                 "acceptance": 0.7 if on else None}
            runs.append({"batch": b, "spec": on, "median": m, "reps": [m]})
        if spec:
            ratios.append({"batch": b, "s_tg_on_off": 0.99, "s_tg_on_off_reps": [0.985, 0.99, 0.995]})
    return {"tool": "bench_batch", "backend": backend, "draft": "d.gguf" if spec else None, "gpu": "NVIDIA H200",
            "command": "bench_batch ...", "date": "2026-12-01T00:00:00Z", "runs": runs, "spec_ratio": ratios}


def selftest():
    md = parse_llama_lines(SAMPLE_MD.splitlines())
    assert [r["pl"] for r in md] == [1, 2, 8], md
    assert md[2] == {"pp": 128, "tg": 128, "pl": 8, "n_kv": 2048, "t_pp": 0.751, "speed_pp": 1363.27,
                     "t_tg": 7.344, "speed_tg": 139.43, "t": 8.095, "speed": 252.99}, md[2]
    jl = parse_llama_lines(SAMPLE_JSONL.splitlines())
    assert [r["pl"] for r in jl] == [1, 2] and abs(jl[1]["speed_tg"] - 23.050371) < 1e-9, jl
    med = llama_medians([md, md[:1], [dict(md[0], speed_tg=50.0)]])
    assert med[0]["pl"] == 1 and med[0]["n_reps"] == 3 and med[0]["speed_tg"] == 41.57, med[0]
    assert med[2]["n_reps"] == 1
    with tempfile.TemporaryDirectory() as d:
        raws = []
        # (the third file has no rows: parse-llama warns about it and goes on)
        for i, text in enumerate((SAMPLE_MD, SAMPLE_MD.replace("139.43", "149.43"), "garbage\n")):
            raws.append(os.path.join(d, f"llama.{i}.out"))
            with open(raws[-1], "w") as f:
                f.write(text)
        assert parse_llama(["--out", os.path.join(d, "llama-llama2-7b-f16.json"), "--command", "x"] + raws) == 0
        lj = load(os.path.join(d, "llama-llama2-7b-f16.json"))
        assert len(lj["reps"]) == 2 and abs(lj["median"][2]["speed_tg"] - 144.43) < 1e-9, lj["median"]
        for name, doc in (("tandem-llama2-7b-f16.json", fake_bench_batch([1, 2, 8, 64], False, "cuda", 300)),
                          ("tandem-pycode-spec-cuda.json", fake_bench_batch([1, 2, 4], True, "cuda", 3000)),
                          ("tandem-pycode-spec-cpu.json", fake_bench_batch([1, 2], True, "cpu", 500))):
            with open(os.path.join(d, name), "w") as f:
                json.dump(doc, f)

        class Sink:
            text = ""

            def write(self, s):
                Sink.text += s

        s = summarize(d, Sink())
        rows = {r["batch"]: r for r in s["compare"]}
        assert set(rows) == {1, 2, 8, 64} and rows[64]["llama_s_tg"] is None
        assert abs(rows[8]["s_tg_ratio"] - rows[8]["tandem_s_tg"] / 144.43) < 1e-9
        assert abs(rows[1]["llama_tpot_ms"] - 1e3 * 3.079 / 128) < 1e-9
        assert len(s["spec"]) == 5 and all(abs(r["s_tg_on_off"] - 0.99) < 1e-9 for r in s["spec"])
        assert "| 8 | 144.4 |" in Sink.text and "Floor" in Sink.text and "Goal" in Sink.text, Sink.text
        assert "| cpu | 2 |" in Sink.text
        assert os.path.exists(os.path.join(d, "batch-summary.json"))
        png = os.path.exists(os.path.join(d, "batch.png"))
        print(Sink.text)
    print(f"selftest: ok ({'with' if png else 'without'} the PNG)")
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "parse-llama":
        return parse_llama(sys.argv[2:])
    if len(sys.argv) == 2 and sys.argv[1] == "selftest":
        return selftest()
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    summarize(sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
