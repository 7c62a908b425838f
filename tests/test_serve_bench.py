"""test_serve_bench.py - a smoke test of bench/serve_bench.py and bench/serve_plot.py
against `tandem serve` on the pycode pair (so the load generator does not rot).

usage: python3 test_serve_bench.py TANDEM [full|reduced]

4 prompts, max_tokens 4, concurrency 1,2 on the chat and the completions endpoint: the
JSON has every summary field, no request failed, each request's samples are there; a
request the server refuses (spec_k out of range) counts as failed with exit 1; the
plot script turns the JSON into its tables.  A few seconds.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import DRAFT, TARGET, Checks, Server  # noqa: E402

TANDEM = sys.argv[1]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BENCH = os.path.join(ROOT, "bench", "serve_bench.py")
PLOT = os.path.join(ROOT, "bench", "serve_plot.py")
PROMPTS = os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl")

c = Checks()
srv = Server(TANDEM, ["-m", TARGET, "-d", DRAFT, "-t", "1", "--max-batch", "4"])
tmp = tempfile.mkdtemp(prefix="tandem-serve-bench.")


def bench(name, *extra):
    out = os.path.join(tmp, name + ".json")
    p = subprocess.run([sys.executable, BENCH, "--port", str(srv.port), "--prompts", PROMPTS, "--num-prompts", "4",
                        "--max-tokens", "4", "--concurrency", "1,2", "--label", name, "--json", out] + list(extra),
                       capture_output=True, text=True, timeout=60)
    try:
        with open(out) as f:
            d = json.load(f)
    except (OSError, ValueError):
        d = None
    return p, d, out


SUMMARY = ["completed", "failed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
           "total_input_tokens", "total_output_tokens", "tokens_per_chunk", "ttft_ms", "tpot_ms", "itl_ms",
           "itl_token_ms", "e2e_ms", "spec"]
files = []
for name, endpoint in (("completions", "/v1/completions"), ("chat", "/v1/chat/completions")):
    p, d, out = bench(name, "--endpoint", endpoint)
    files.append(out)
    c.check(p.returncode == 0, name + ": serve_bench exits 0", p.stderr[-600:])
    c.check("Serving Benchmark Result" in p.stdout and "P99 TPOT (ms):" in p.stdout, name + ": the table", p.stdout[-600:])
    if not c.check(d is not None and [r["concurrency"] for r in d["runs"]] == [1, 2], name + ": a JSON run per concurrency"):
        continue
    for run in d["runs"]:
        s, where = run["summary"], "%s c=%d" % (name, run["concurrency"])
        c.check(all(k in s for k in SUMMARY), where + ": every summary field", sorted(s))
        c.check(s["completed"] == 4 and s["failed"] == 0, where + ": 4 completed, none failed", s.get("errors"))
        c.check(all(s[k][q] is not None for k in ("ttft_ms", "e2e_ms", "tpot_ms") for q in ("mean", "p50", "p90", "p99")),
                where + ": TTFT, TPOT and E2E have mean and percentiles", s)
        c.check(s["total_output_tokens"] > 0 and s["output_throughput"] > 0, where + ": output tokens counted", s)
        reqs = run["requests"]
        c.check(len(reqs) == 4 and all(r["ok"] and r["chunks"] and 0 < r["output_tokens"] <= 4 and
                                       r["ttft"] <= r["e2e"] for r in reqs),
                where + ": every request's samples", reqs[:1])

p, d, _ = bench("refused", "--extra-body", '{"spec_k": 999}', "--warmup", "0", "--quiet")
c.check(p.returncode == 1, "a refused request: exit 1", p.returncode)
c.check(d is not None and d["runs"][0]["summary"]["failed"] == 4 and
        any("HTTP 400" in e for e in d["runs"][0]["summary"]["errors"]), "a refused request counts as failed (HTTP 400)",
        d and d["runs"][0]["summary"]["errors"])

p = subprocess.run([sys.executable, PLOT] + files, capture_output=True, text=True, timeout=60)
c.check(p.returncode == 0 and "| concurrency |" in p.stdout and "**chat**" in p.stdout, "serve_plot's tables",
        p.stdout[-300:] + p.stderr[-300:])
srv.stop()
shutil.rmtree(tmp, ignore_errors=True)
c.finish()
