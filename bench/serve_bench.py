#!/usr/bin/env python3
"""serve_bench.py - a load generator for `tandem serve` (or any OpenAI-compatible
server), in the style of `vllm bench serve`.  Python 3 standard library only.

    bench/serve_bench.py --base-url http://127.0.0.1:8080 --prompts tests/data/prompts-dev.jsonl \
        --num-prompts 64 --max-tokens 64 --concurrency 1,4,16,32 --json out.json --label spec-cpu

Every request streams (`"stream": true, "stream_options": {"include_usage": true}`);
the SSE stream is parsed here.  A run sends --num-prompts requests, at most C at once
(--concurrency; 0 = no limit) with Poisson arrivals at R requests per second
(--request-rate; inf = all at once).  A comma list in either sweeps it: one run per
value (both lists given: every pair).

What is measured, per request (times from just before the connection opens):
  TTFT   time to the first chunk whose text is not empty
  E2E    time to the end of the stream ([DONE])
  TPOT   (E2E - TTFT) / (output tokens - 1): time per output token after the first,
         with output tokens = usage.completion_tokens of the usage chunk (requests of
         one output token have none)
  ITL    the gaps between successive text chunks, one sample per gap (vLLM's
         definition).  tandem sends the tokens the scheduler commits together in one
         chunk (several, when a speculative step accepts drafted tokens), so ITL is a
         time per *chunk*; its mean is TPOT times the tokens per chunk (reported).
  ITL/token  the same gaps shared out over the tokens of their chunk: a gap g ending
         a chunk of b bytes counts as t = 1 + (n - m) * b / B tokens of g / t each (n
         the request's output tokens, m its text chunks, B its text bytes: every chunk
         holds a token, the tokens beyond one per chunk are estimated from each
         chunk's share of the text) and the percentiles are over tokens.
         Without speculation (one token per chunk) it is close to ITL; with it, it is
         the latency a reader of the stream sees per token, comparable with TPOT.
Prompts: every run sends the same --num-prompts prompts, so each prompt gets a first
line of its own ("# NONCE-RUN-I" on completions; on chat, before the first message's
content): without it the server's prefix cache would hold the prompts of the runs
before and every run but the first would skip most of its prefill.  --same-prompts
sends them unchanged (to measure the prefix cache).

Over a run: request throughput (completed requests / duration), output token
throughput (output tokens / duration), total token throughput (prompt + output
tokens / duration), the duration from the first send to the last end; failed
requests (an HTTP status other than 200, an error event, a stream without [DONE] or
usage, a connection error) are counted and left out of the latency figures.

The table goes to stdout, a progress line to stderr (a bar on a terminal, a line every
few seconds otherwise), everything (settings, summaries, every request's samples) to
--json.  Exit 0 when every run finished; 1 when a request failed (unless
--allow-failures); 2 on bad arguments.
"""
import argparse
import http.client
import json
import math
import os
import random
import sys
import threading
import time
import urllib.parse

# ---------------------------------------------------------------- statistics


def percentile(xs, p, weights=None):
    """The p-th percentile (0..100) of xs, linear between closest ranks (numpy's
    default); with weights, the smallest x whose cumulative weight reaches p %."""
    if not xs:
        return None
    if weights is None:
        s = sorted(xs)
        k = (len(s) - 1) * p / 100.0
        lo = math.floor(k)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)
    pairs = sorted(zip(xs, weights))
    total = sum(w for _, w in pairs)
    acc = 0.0
    for x, w in pairs:
        acc += w
        if acc >= total * p / 100.0 - 1e-12:
            return x
    return pairs[-1][0]


def dist(xs, weights=None):
    """{mean, p50, p90, p99, n} in the unit of xs (None where there are no samples)."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "n": 0}
    if weights is None:
        mean = sum(xs) / len(xs)
    else:
        tw = sum(weights)
        mean = sum(x * w for x, w in zip(xs, weights)) / tw if tw > 0 else None
    out = {"mean": mean}
    for p in (50, 90, 99):
        out["p%d" % p] = percentile(xs, p, weights)
    out["n"] = len(xs)
    return out


# ---------------------------------------------------------------- prompts


def load_prompts(path, endpoint, n, seed):
    """n request bodies' prompt parts ({"prompt": ...} or {"messages": ...}) from a JSON
    lines file, cycled when it has fewer lines; shuffled with seed (None: file order)."""
    items = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise SystemExit("serve_bench: %s:%d: not JSON: %s" % (path, i, e))
            chat = endpoint.endswith("/chat/completions")
            if "messages" in d:
                if not chat:
                    raise SystemExit("serve_bench: %s:%d has \"messages\": use --endpoint /v1/chat/completions" % (path, i))
                items.append({"messages": d["messages"]})
            elif "prompt" in d:
                items.append({"messages": [{"role": "user", "content": d["prompt"]}]} if chat else {"prompt": d["prompt"]})
            else:
                raise SystemExit("serve_bench: %s:%d has neither \"prompt\" nor \"messages\"" % (path, i))
    if not items:
        raise SystemExit("serve_bench: %s holds no prompts" % path)
    if seed is not None:
        random.Random(seed).shuffle(items)
    return [items[i % len(items)] for i in range(n)]


# ---------------------------------------------------------------- one request


class Target:
    def __init__(self, base_url, endpoint, api_key, timeout):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit("serve_bench: --base-url must be http://HOST:PORT (got %r)" % base_url)
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.path = u.path.rstrip("/") + endpoint
        self.base_path = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get(self, path, timeout=5):
        c = self.conn()
        c.timeout = timeout
        try:
            c.request("GET", self.base_path + path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


def run_request(target, body):
    """Sends one streaming request; a dict of its samples (times in seconds)."""
    rec = {"ok": False, "error": None, "ttft": None, "e2e": None, "tpot": None, "output_tokens": 0,
           "prompt_tokens": 0, "chunks": [], "spec": None, "finish_reason": None}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if target.api_key:
        headers["Authorization"] = "Bearer " + target.api_key
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    rec["t_start"] = t0
    c = target.conn()
    n_bytes = 0
    done = False
    try:
        c.request("POST", target.path, body=data, headers=headers)
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = "HTTP %d: %s" % (r.status, r.read()[:300].decode("utf-8", "replace"))
            return rec
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # (blank separators, ": ping" comments)
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            ev = json.loads(payload)
            if "error" in ev:
                rec["error"] = "stream error: " + json.dumps(ev["error"])[:300]
                return rec
            if ev.get("usage"):
                u = ev["usage"]
                rec["output_tokens"] = int(u.get("completion_tokens") or 0)
                rec["prompt_tokens"] = int(u.get("prompt_tokens") or 0)
                rec["spec"] = u.get("spec")
            for ch in ev.get("choices") or []:
                text = ch.get("text")
                if text is None:
                    text = (ch.get("delta") or {}).get("content")
                if text:
                    b = len(text.encode("utf-8"))
                    n_bytes += b
                    rec["chunks"].append([round(now - t0, 6), b])  # (us: the JSON stays small)
                if ch.get("finish_reason"):
                    rec["finish_reason"] = ch["finish_reason"]
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = "%s: %s" % (type(e).__name__, e)
        return rec
    finally:
        c.close()
        rec["e2e"] = time.perf_counter() - t0
    if not done:
        rec["error"] = "the stream ended without [DONE]"
    elif rec["output_tokens"] <= 0 and rec["chunks"]:
        rec["error"] = "no usage chunk (the server ignored stream_options.include_usage?)"
    else:
        rec["ok"] = True
        if rec["chunks"]:
            rec["ttft"] = rec["chunks"][0][0]
            if rec["output_tokens"] > 1:
                rec["tpot"] = (rec["e2e"] - rec["ttft"]) / (rec["output_tokens"] - 1)
        rec["text_bytes"] = n_bytes
    return rec


def itl_samples(rec):
    """(gaps, per-token gaps, their token weights) of a request's chunks."""
    ch = rec["chunks"]
    gaps, per_tok, w = [], [], []
    total_b = sum(b for _, b in ch)
    n = rec["output_tokens"]
    extra = max(0, n - len(ch))  # (tokens beyond one per chunk)
    for (ta, _), (tb, b) in zip(ch, ch[1:]):
        g = tb - ta
        gaps.append(g)
        t = 1.0 + (extra * b / total_b if total_b else 0.0)
        per_tok.append(g / t)
        w.append(t)
    return gaps, per_tok, w


# ---------------------------------------------------------------- a run


class Progress:
    def __init__(self, total, label, quiet):
        self.total, self.label, self.quiet = total, label, quiet
        self.done = self.failed = 0
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.t_line = self.t0
        self.lock = threading.Lock()

    def tick(self, ok):
        with self.lock:
            self.done += 1
            self.failed += 0 if ok else 1
            if self.quiet:
                return
            now = time.perf_counter()
            last = self.done == self.total
            if self.tty:
                w = 30
                k = w * self.done // self.total
                sys.stderr.write("\r%s [%s%s] %d/%d  %.1fs%s" % (self.label, "#" * k, "." * (w - k), self.done,
                                 self.total, now - self.t0, ("  failed %d" % self.failed) if self.failed else ""))
                if last:
                    sys.stderr.write("\n")
                sys.stderr.flush()
            elif last or now - self.t_line >= 5.0:
                self.t_line = now
                sys.stderr.write("%s: %d/%d requests, %.1f s, %d failed\n" % (self.label, self.done, self.total,
                                 now - self.t0, self.failed))
                sys.stderr.flush()


def one_run(target, bodies, concurrency, rate, seed, label, quiet):
    """Sends every body (at most `concurrency` at once, 0 = any; Poisson arrivals at
    `rate` per second, inf = all at once); (records, duration)."""
    recs = [None] * len(bodies)
    sem = threading.Semaphore(concurrency) if concurrency > 0 else None
    prog = Progress(len(bodies), label, quiet)
    rng = random.Random(seed)

    def work(i):
        if sem:
            sem.acquire()
        try:
            recs[i] = run_request(target, bodies[i])
        finally:
            if sem:
                sem.release()
        prog.tick(recs[i]["ok"])

    threads = []
    t0 = time.perf_counter()
    t_next = t0
    for i in range(len(bodies)):
        if i > 0 and rate != math.inf:
            t_next += rng.expovariate(rate)
            d = t_next - time.perf_counter()
            if d > 0:
                time.sleep(d)
        th = threading.Thread(target=work, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    t_end = max([r["t_start"] + (r["e2e"] or 0) for r in recs] + [t0])
    for r in recs:
        r["t_start"] -= t0
    return recs, t_end - t0


def summarize(recs, duration):
    ok = [r for r in recs if r["ok"]]
    gaps, per_tok, w = [], [], []
    for r in ok:
        g, p, ww = itl_samples(r)
        gaps += g
        per_tok += p
        w += ww
    out_tok = sum(r["output_tokens"] for r in ok)
    in_tok = sum(r["prompt_tokens"] for r in ok)
    n_chunks = sum(len(r["chunks"]) for r in ok)
    ms = lambda d: {k: (v * 1000.0 if v is not None and k != "n" else v) for k, v in d.items()}
    s = {
        "completed": len(ok), "failed": len(recs) - len(ok), "duration_s": duration,
        "total_input_tokens": in_tok, "total_output_tokens": out_tok,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tok / duration if duration > 0 else None,
        "total_token_throughput": (in_tok + out_tok) / duration if duration > 0 else None,
        "tokens_per_chunk": out_tok / n_chunks if n_chunks else None,
        "ttft_ms": ms(dist([r["ttft"] for r in ok if r["ttft"] is not None])),
        "tpot_ms": ms(dist([r["tpot"] for r in ok if r["tpot"] is not None])),
        "itl_ms": ms(dist(gaps)),
        "itl_token_ms": ms(dist(per_tok, w)),
        "e2e_ms": ms(dist([r["e2e"] for r in ok])),
    }
    specs = [r["spec"] for r in ok if r.get("spec")]
    if specs:
        dr = sum(x.get("drafted", 0) for x in specs)
        ac = sum(x.get("accepted", 0) for x in specs)
        st = sum(x.get("steps", 0) for x in specs)
        # (a speculative step commits its accepted tokens + 1; the controller may decode
        # without speculating, so steps need not cover every token)
        s["spec"] = {"steps": st, "drafted": dr, "accepted": ac, "acceptance_rate": ac / dr if dr else None,
                     "tokens_per_spec_step": (st + ac) / st if st else None,
                     "speculative_share": (st + ac) / out_tok if out_tok else None}
    errors = {}
    for r in recs:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    s["errors"] = errors
    return s


def print_table(label, conc, rate, s, out=sys.stdout):
    f = lambda v, d=2: "-" if v is None else ("%.*f" % (d, v))
    w = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="=")]
    row = lambda k, v: lines.append("{:<40}{:>10}".format(k, v))
    if label:
        row("Label:", label)
    row("Max concurrency:", "inf" if conc <= 0 else str(conc))
    row("Request rate (req/s):", "inf" if rate == math.inf else f(rate))
    row("Successful requests:", str(s["completed"]))
    row("Failed requests:", str(s["failed"]))
    row("Benchmark duration (s):", f(s["duration_s"]))
    row("Total input tokens:", str(s["total_input_tokens"]))
    row("Total generated tokens:", str(s["total_output_tokens"]))
    row("Request throughput (req/s):", f(s["request_throughput"]))
    row("Output token throughput (tok/s):", f(s["output_throughput"]))
    row("Total token throughput (tok/s):", f(s["total_token_throughput"]))
    row("Output tokens per chunk:", f(s["tokens_per_chunk"]))
    if s.get("spec"):
        row("Draft acceptance rate:", f(s["spec"]["acceptance_rate"], 3))
        row("Tokens per speculative step:", f(s["spec"]["tokens_per_spec_step"]))
        row("Tokens from speculative steps:", "-" if s["spec"]["speculative_share"] is None
            else "%.0f %%" % (100 * s["spec"]["speculative_share"]))
    for key, title, name in (("ttft_ms", "Time to First Token", "TTFT"), ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
                             ("itl_ms", "Inter-token Latency (per chunk)", "ITL"),
                             ("itl_token_ms", "Inter-token Latency (per token)", "ITL/tok"),
                             ("e2e_ms", "End-to-end Latency", "E2EL")):
        lines.append("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        d = s[key]
        row("Mean %s (ms):" % name, f(d["mean"]))
        for p in (50, 90, 99):
            row("P%d %s (ms):" % (p, name), f(d["p%d" % p]))
    lines.append("=" * w)
    for e, n in s["errors"].items():
        lines.append("failed x%d: %s" % (n, e))
    print("\n".join(lines), file=out, flush=True)


def parse_list(text, what, conv):
    try:
        return [conv(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SystemExit("serve_bench: bad %s %r" % (what, text))


def wait_health(target, seconds):
    t_end = time.time() + seconds
    last = None
    while time.time() < t_end:
        try:
            st, _ = target.get("/health", timeout=2)
            if st == 200:
                return
            last = "HTTP %d" % st
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    raise SystemExit("serve_bench: %s:%d/health not 200 within %g s (%s)" % (target.host, target.port, seconds, last))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Load generator for OpenAI-compatible servers (tandem serve).",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--base-url", help="http://HOST:PORT (default from --host/--port)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    ap.add_argument("--model", help="the model id to send (default: the server's first, GET /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--prompts", required=True, help="JSON lines with \"prompt\" or \"messages\" (tests/data/prompts-dev.jsonl)")
    ap.add_argument("--num-prompts", type=int, default=64, help="requests per run (the file is cycled; default 64)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    ap.add_argument("--concurrency", default="0", help="most requests in flight, a comma list to sweep (0 = no limit; default 0)")
    ap.add_argument("--request-rate", default="inf", help="Poisson arrivals per second, a comma list (default inf: all at once)")
    ap.add_argument("--temperature", type=float, default=0.0, help="default 0 (greedy)")
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompt order, the arrivals and each request's seed (seed + i)")
    ap.add_argument("--no-shuffle", action="store_true", help="prompts in file order")
    ap.add_argument("--extra-body", default="{}", help="JSON members added to every request body, e.g. '{\"spec_k\": 4}'")
    ap.add_argument("--same-prompts", action="store_true",
                    help="no first line of its own per prompt and run (the server's prefix cache then serves repeats)")
    ap.add_argument("--warmup", type=int, default=1, help="requests sent (one at a time) before the runs, not measured (default 1)")
    ap.add_argument("--wait-health", type=float, default=0, help="first wait up to S seconds for GET /health = 200")
    ap.add_argument("--timeout", type=float, default=600, help="a request's socket timeout in seconds (default 600)")
    ap.add_argument("--label", default="", help="names the configuration in the table, the JSON and the plots")
    ap.add_argument("--json", help="write settings, summaries and every request's samples here")
    ap.add_argument("--allow-failures", action="store_true", help="exit 0 even when requests failed")
    ap.add_argument("--quiet", action="store_true", help="no progress line")
    a = ap.parse_args(argv)

    concs = parse_list(a.concurrency, "--concurrency", int)
    rates = parse_list(a.request_rate, "--request-rate", float)
    if not concs or not rates or any(c < 0 for c in concs) or any(not r > 0 for r in rates):
        ap.error("--concurrency wants integers >= 0, --request-rate numbers > 0 or inf")
    if a.num_prompts < 1 or a.max_tokens < 1:
        ap.error("--num-prompts and --max-tokens must be >= 1")
    try:
        extra = json.loads(a.extra_body)
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as e:
        ap.error("--extra-body is not a JSON object: %s" % e)

    target = Target(a.base_url or "http://%s:%d" % (a.host, a.port), a.endpoint, a.api_key, a.timeout)
    if a.wait_health > 0:
        wait_health(target, a.wait_health)
    model = a.model
    if not model:
        try:
            st, data = target.get("/v1/models")
            model = json.loads(data)["data"][0]["id"] if st == 200 else None
        except (OSError, ValueError, KeyError, IndexError):
            model = None
    prompts = load_prompts(a.prompts, a.endpoint, a.num_prompts + a.warmup, None if a.no_shuffle else a.seed)

    nonce = "%06x" % random.SystemRandom().getrandbits(24)

    def unique(p, tag):
        """p with a first line of its own (a copy)."""
        if a.same_prompts:
            return p
        line = "# %s-%s\n" % (nonce, tag)
        if "prompt" in p:
            return {"prompt": line + p["prompt"]}
        msgs = [dict(m) for m in p["messages"]]
        c0 = msgs[0].get("content")
        msgs[0]["content"] = [{"type": "text", "text": line}] + c0 if isinstance(c0, list) else line + (c0 or "")
        return {"messages": msgs}

    def body(i, p):
        b = {"max_tokens": a.max_tokens, "temperature": a.temperature, "stream": True,
             "stream_options": {"include_usage": True}}
        if a.endpoint.endswith("/chat/completions"):
            b["max_completion_tokens"] = a.max_tokens
        if model:
            b["model"] = model
        if a.top_p is not None:
            b["top_p"] = a.top_p
        if a.temperature > 0:
            b["seed"] = a.seed + i
        b.update(p)
        b.update(extra)
        return b

    for i, p in enumerate(prompts[:a.warmup]):
        r = run_request(target, body(a.num_prompts + i, unique(p, "w%d" % i)))
        if not r["ok"]:
            print("serve_bench: the warm-up request failed: %s" % r["error"], file=sys.stderr)
            return 1

    result = {"label": a.label, "base_url": "http://%s:%d" % (target.host, target.port), "endpoint": a.endpoint,
              "model": model, "prompts": a.prompts, "num_prompts": a.num_prompts, "max_tokens": a.max_tokens,
              "temperature": a.temperature, "seed": a.seed, "extra_body": extra,
              "same_prompts": a.same_prompts, "nonce": nonce,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:] if argv is None else argv,
              "definitions": "times in ms; TTFT = send to first text chunk; TPOT = (E2E - TTFT) / (completion_tokens - 1); "
                             "ITL = gap between text chunks (one per chunk); ITL/token = each gap shared over its chunk's "
                             "tokens (estimated from its text bytes), percentiles over tokens",
              "runs": []}
    any_failed = False
    k = 0
    for rate in rates:
        for c in concs:
            k += 1
            bodies = [body(i, unique(p, "%d-%d" % (k, i))) for i, p in enumerate(prompts[a.warmup:])]
            name = "%s c=%s r=%s" % (a.label or "run", c if c > 0 else "inf", "inf" if rate == math.inf else "%g" % rate)
            recs, dur = one_run(target, bodies, c, rate, a.seed, name, a.quiet)
            s = summarize(recs, dur)
            any_failed |= s["failed"] > 0
            print_table(a.label, c, rate, s)
            result["runs"].append({"concurrency": c, "request_rate": None if rate == math.inf else rate,
                                   "summary": s, "requests": recs})
            if a.json:  # (written after every run: a sweep cut short keeps what it measured)
                tmp = a.json + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(result, f, separators=(",", ":"))
                os.replace(tmp, a.json)
    return 1 if any_failed and not a.allow_failures else 0


if __name__ == "__main__":
    sys.exit(main())
