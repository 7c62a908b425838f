#!/usr/bin/env python3
"""xcheck_eagle3.py - cross-checks tandem's EAGLE-3 drafting with llama.cpp's (issue 46).

Both engines load the same target and EAGLE-3 head (llama.cpp's eagle3 GGUF) and
decode the first N dev prompts greedily with a fixed chain length k (no n-gram
lookups, no p_min, same max tokens, same threads): tandem through `tandem generate
-d HEAD --spec-k K --spec-ngram 0` with TANDEM_SCHED_LOG=1 (each step's chain, its
position and what was accepted), llama.cpp through its own drafter
(common/speculative.cpp `draft-eagle3`) driven by bench/xcheck_eagle3_llama.cpp,
compiled here with g++ against the llama.cpp tree and its built libraries (no
program of that tree drives draft-eagle3 on the CPU build: see the driver's header).
Both engines also decode target-only, and tests/data/refs-dev.jsonl holds the
transformers float32 greedy continuations.

Per prompt: the prompt's ids (tandem, llama.cpp, the reference), whether the
outputs are equal (each engine's speculative output = its target-only output = the
other engine's = the reference), the steps whose chains are identical and whose
accepted counts are equal (steps keyed by the number of tokens generated before
them: while the outputs agree both engines take a step at the same places).
Totals: the agreement of drafted tokens (same token at the same depth of the same
step), the steps with identical chains, mean accepted tokens per step for each.

Python 3 standard library only.  Example (from the repository root, after
`meson compile -C build-nc`):
    python3 bench/xcheck_eagle3.py --head HEAD.gguf --limit 100 -n 64 -k 4 -t 2 \\
        --out bench/results/xcheck-eagle3-2026-12-07
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

STEP_RE = re.compile(r"step: request (\d+), k \d+, proposed (\d+) .*?accepted (\d+);.*; at (\d+), chain \[([\d ]*)\]")


def run(cmd, env=None, stdin=None):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-4000:]))
    return p.stdout, p.stderr, time.time() - t0


def build_driver(args, exe):
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xcheck_eagle3_llama.cpp")
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return
    L = args.llama_src
    run(["g++", "-O2", "-std=c++17", "-I" + L + "/include", "-I" + L + "/common", "-I" + L + "/ggml/include",
         src, "-o", exe, "-L" + args.llama_lib, "-lllama-common", "-lllama", "-lggml", "-lggml-base",
         "-Wl,-rpath," + args.llama_lib])


def parse_llama(text):
    """{prompt index: {"prompt": ids, "steps": {at: (chain, accepted)}, "out": ids}}"""
    res = {}
    cur = None
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "P":
            cur = res.setdefault(int(f[1]), {"steps": {}})
            cur["prompt"] = [int(x) for x in f[2:]]
        elif f[0] == "S":
            at, k = int(f[1]), int(f[2])
            chain = [int(x) for x in f[3:3 + k]]
            assert f[3 + k] == "A"
            cur["steps"][at] = (chain, int(f[4 + k]))
        elif f[0] == "O":
            res[int(f[1])]["out"] = [int(x) for x in f[2:]]
    return res


def parse_tandem(stdout, stderr, n):
    """The same shape as parse_llama's (no prompt ids: tandem tokenize gives them);
    request r of the run is prompt r - 1 (one sequence at a time, in input order),
    checked against each result's drafted total."""
    res = {i: {"steps": {}} for i in range(n)}
    for line in stdout.splitlines():
        j = json.loads(line)
        res[int(j["id"])]["out"] = j["tokens"]
        res[int(j["id"])]["drafted"] = j.get("spec", {}).get("drafted")
    for m in STEP_RE.finditer(stderr):
        req, k, acc, at = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))
        chain = [int(x) for x in m.group(5).split()]
        assert len(chain) == k
        res[req - 1]["steps"][at] = (chain, acc)
    for i, r in res.items():
        if r.get("drafted") is not None:
            got = sum(len(c) for c, _ in r["steps"].values())
            if got != r["drafted"]:
                sys.exit("tandem's log of prompt %d holds %d drafted tokens, its result %d" % (i, got, r["drafted"]))
    return res


def strip_eos(ids, eos):
    return ids[:ids.index(eos)] if eos in ids else ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default="build-nc/tandem")
    ap.add_argument("--target", default="models/pycode-target-f16.gguf")
    ap.add_argument("--head", required=True, help="EAGLE-3 head (llama.cpp's eagle3 GGUF)")
    ap.add_argument("--prompts", default="tests/data/prompts-dev.jsonl")
    ap.add_argument("--refs", default="tests/data/refs-dev.jsonl", help="reference greedy ids ('' = none)")
    ap.add_argument("--limit", type=int, default=20, help="the first N prompts (default 20)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("-k", "--spec-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--eos", type=int, default=0, help="the end-of-generation id (pycode: 0)")
    ap.add_argument("--llama-src", default="/work/peer/llama-2606")
    ap.add_argument("--llama-lib", default="/work/peer/lb/bin")
    ap.add_argument("--out", required=True, help="folder for the raw logs and the summary")
    ap.add_argument("--work", default="build-nc/xcheck", help="folder for the driver and the prompt files")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.join(args.work, "prompts"), exist_ok=True)
    prompts = [json.loads(l) for l in open(args.prompts)][:args.limit]
    n = len(prompts)
    refs = {}
    if args.refs:
        for l in open(args.refs):
            r = json.loads(l)
            refs[r["id"]] = r
    files = []
    with open(os.path.join(args.work, "prompts.jsonl"), "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p["prompt"]}) + "\n")
            files.append(os.path.join(args.work, "prompts", "%d.txt" % i))
            with open(files[-1], "w") as g:
                g.write(p["prompt"])
    exe = os.path.join(args.work, "xcheck_eagle3_llama")
    build_driver(args, exe)

    N, K, T = str(args.max_tokens), str(args.spec_k), str(args.threads)
    raw = {}
    # llama.cpp: speculative, then target-only
    raw["llama_spec"] = run([exe, args.target, args.head, N, K, T] + files)
    raw["llama_plain"] = run([exe, args.target, "-", N, K, T] + files)
    # tandem: speculative (the step log on stderr), then target-only
    env = dict(os.environ, TANDEM_SCHED_LOG="1")
    common = ["--prompts", os.path.join(args.work, "prompts.jsonl"), "-n", N, "-t", T, "--temp", "0", "--json"]
    raw["tandem_spec"] = run([args.tandem, "generate", "-m", args.target, "-d", args.head, "--spec-k", K,
                              "--spec-ngram", "0", "--p-min", "0"] + common, env=env)
    raw["tandem_plain"] = run([args.tandem, "generate", "-m", args.target] + common)
    for name, (out, err, secs) in raw.items():
        with open(os.path.join(args.out, name + ".out"), "w") as f:
            f.write(out)
        if err:
            with open(os.path.join(args.out, name + ".err"), "w") as f:
                f.write(err)
    tpids = [json.loads(run([args.tandem, "tokenize", "-m", args.target], stdin=p["prompt"])[0]) for p in prompts]

    ls, lp = parse_llama(raw["llama_spec"][0]), parse_llama(raw["llama_plain"][0])
    ts, tp = parse_tandem(raw["tandem_spec"][0], raw["tandem_spec"][1], n), parse_tandem(raw["tandem_plain"][0], "", n)

    rows = []
    tot = dict(tok=0, tok_eq=0, steps=0, steps_eq=0, acc_eq=0, t_steps=0, t_acc=0, l_steps=0, l_acc=0,
               only_t=0, only_l=0, prompt_eq=0, out_eq=0, ref_eq=0)
    for i in range(n):
        eos = args.eos
        o = {k: strip_eos(v[i]["out"], eos) for k, v in
             (("tandem_spec", ts), ("tandem_plain", tp), ("llama_spec", ls), ("llama_plain", lp))}
        ref = refs.get(prompts[i]["id"]) if refs else None
        prompt_eq = tpids[i] == ls[i]["prompt"] and (ref is None or ref["prompt_ids"] == tpids[i])
        out_eq = len({tuple(v) for v in o.values()}) == 1
        ref_eq = ref is not None and o["tandem_spec"][:len(ref["target_greedy_ids"])] == ref["target_greedy_ids"][:len(o["tandem_spec"])]
        st, sl = ts[i]["steps"], ls[i]["steps"]
        common_at = sorted(set(st) & set(sl))
        tok = tok_eq = steps_eq = acc_eq = 0
        first_diff = None
        for at in common_at:
            (ct, at_), (cl, al) = st[at], sl[at]
            tok += max(len(ct), len(cl))
            tok_eq += sum(1 for a, b in zip(ct, cl) if a == b)
            steps_eq += ct == cl
            acc_eq += at_ == al
            if ct != cl and first_diff is None:
                first_diff = (at, ct, cl)
        r = dict(id=prompts[i]["id"], prompt_eq=prompt_eq, out_eq=out_eq, ref_eq=ref_eq,
                 t_steps=len(st), l_steps=len(sl), common=len(common_at), steps_eq=steps_eq, acc_eq=acc_eq,
                 tok=tok, tok_eq=tok_eq, t_acc=sum(a for _, a in st.values()), l_acc=sum(a for _, a in sl.values()),
                 first_diff=first_diff)
        rows.append(r)
        for key in ("tok", "tok_eq", "steps_eq", "acc_eq", "t_steps", "t_acc", "l_steps", "l_acc"):
            tot[key] += r[key]
        tot["steps"] += len(common_at)
        tot["only_t"] += len(set(st) - set(sl))
        tot["only_l"] += len(set(sl) - set(st))
        tot["prompt_eq"] += prompt_eq
        tot["out_eq"] += out_eq
        tot["ref_eq"] += ref_eq

    lines = []
    lines.append("| prompt | prompt ids equal | outputs equal (4 runs) | = reference | steps (tandem / llama.cpp / both) | identical chains | equal accepted | drafted tokens equal | accepted (tandem / llama.cpp) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    yn = lambda b: "yes" if b else "**no**"
    for r in rows:
        lines.append("| %d | %s | %s | %s | %d / %d / %d | %d | %d | %d / %d | %d / %d |" % (
            r["id"], yn(r["prompt_eq"]), yn(r["out_eq"]), yn(r["ref_eq"]), r["t_steps"], r["l_steps"], r["common"],
            r["steps_eq"], r["acc_eq"], r["tok_eq"], r["tok"], r["t_acc"], r["l_acc"]))
    pct = lambda a, b: 100.0 * a / b if b else 0.0
    summary = [
        "prompts %d, max tokens %s, k %s, threads %s, head %s" % (n, N, K, T, args.head),
        "prompt ids equal (tandem = llama.cpp = reference): %d / %d" % (tot["prompt_eq"], n),
        "outputs equal (tandem and llama.cpp, speculative and target-only): %d / %d; = reference: %d / %d" % (
            tot["out_eq"], n, tot["ref_eq"], n),
        "steps: tandem %d, llama.cpp %d, at the same place %d (tandem only %d, llama.cpp only %d)" % (
            tot["t_steps"], tot["l_steps"], tot["steps"], tot["only_t"], tot["only_l"]),
        "drafted tokens equal: %d / %d = %.2f %%" % (tot["tok_eq"], tot["tok"], pct(tot["tok_eq"], tot["tok"])),
        "steps with identical chains: %d / %d = %.2f %%; equal accepted counts: %d / %d = %.2f %%" % (
            tot["steps_eq"], tot["steps"], pct(tot["steps_eq"], tot["steps"]), tot["acc_eq"], tot["steps"],
            pct(tot["acc_eq"], tot["steps"])),
        "mean accepted per step: tandem %.4f (%d / %d), llama.cpp %.4f (%d / %d)" % (
            tot["t_acc"] / max(tot["t_steps"], 1), tot["t_acc"], tot["t_steps"],
            tot["l_acc"] / max(tot["l_steps"], 1), tot["l_acc"], tot["l_steps"]),
        "seconds: " + ", ".join("%s %.1f" % (k, v[2]) for k, v in raw.items()),
    ]
    diffs = ["prompt %d, at %d: tandem %s, llama.cpp %s" % (r["id"], *r["first_diff"]) for r in rows if r["first_diff"]]
    text = "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
    if diffs:
        text += "\nfirst differing chain per prompt:\n" + "\n".join(diffs) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    ok = tot["prompt_eq"] == n and tot["out_eq"] == n and tot["steps_eq"] == tot["steps"] == tot["t_steps"] == tot["l_steps"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
