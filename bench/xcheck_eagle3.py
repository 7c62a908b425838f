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
accepted counts are equal.  Steps are keyed by the number of tokens generated before
them and compared where both engines take a step there after the same text (where
the outputs parted, the contexts differ: those steps are counted apart).  Totals:
the agreement of drafted tokens (same token at the same depth of the same step), the
steps with identical chains, mean accepted tokens per step for each.  Then every
differing chain and every output that leaves the reference; with --ref each is
judged by bench/xcheck_eagle3_ref.py's float64 recomputation (whose token it takes
where they part, and by what margin over the runner-up).  The raw outputs and the
summary go to --out; --from-logs summarises them again (gzipped too) without running.

Python 3 standard library only (--ref: numpy).  Example (from the repository root,
after `meson compile -C build-nc`):
    python3 bench/xcheck_eagle3.py --head HEAD.gguf --limit 100 -n 64 -k 4 -t 2 --llama-threads 1 \\
        --ref --out bench/results/xcheck-eagle3-2026-12-07/trained-100
"""
import argparse
import gzip
import json
import os
import re
import shlex
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


def differences(args, rows):
    """Every differing chain and every output that leaves the reference, as text;
    with --ref, each judged by a float64 recomputation (bench/xcheck_eagle3_ref.py):
    the token it takes where the chains part, and its margin over the runner-up."""
    ref = None
    if args.ref:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import xcheck_eagle3_ref as ref  # (numpy)
        tkv, tw = ref.load(args.target)
        hkv, hw = ref.load(args.head)
    out = []
    tally = {"tandem": 0, "llama.cpp": 0, "neither": 0, "margin": 0.0}
    for r in rows:
        for at, ct, cl in r["diff_steps"]:
            line = "prompt %d, step at %d: tandem %s, llama.cpp %s" % (r["id"], at, ct, cl)
            if ref:
                ids = ref.np.array(r["prompt_ids"] + r["outs"]["tandem_spec"][:at])
                feats, _ = ref.target_forward(tkv, tw, ids[:-1], hkv["eagle3.target_layers"])
                chain = ref.head_chain(hkv, hw, tw, feats, ids, len(ct))
                j = next(d for d in range(min(len(ct), len(cl))) if ct[d] != cl[d])
                t, top = chain[j]
                who = "tandem" if t == ct[j] else "llama.cpp" if t == cl[j] else "neither"
                tally[who] += 1
                tally["margin"] = max(tally["margin"], top[0][0] - top[1][0])
                line += "; depth %d: float64 %d = %s's, margin %.3g over %d" % (
                    j + 1, t, who, top[0][0] - top[1][0], top[1][1])
            out.append(line)
        if r["ref_out"] is None:
            continue
        for name, o in sorted(r["outs"].items()):
            rr = r["ref_out"]
            j = next((d for d in range(min(len(o), len(rr))) if o[d] != rr[d]), None)
            if j is None:
                continue
            line = "prompt %d, %s's output leaves the reference at generated token %d: %d, reference %d" % (
                r["id"], name, j, o[j], rr[j])
            if ref:
                ids = ref.np.array(r["prompt_ids"] + rr[:j])
                _, logits = ref.target_forward(tkv, tw, ids, [0, 0, 0])
                top = ref.np.argsort(-logits)[:2]
                line += "; float64 %d, margin %.3g over %d" % (top[0], logits[top[0]] - logits[top[1]], top[1])
            out.append(line)
    if ref and sum(tally[k] for k in ("tandem", "llama.cpp", "neither")):
        out.insert(0, "differing chains where float64 takes tandem's token %d, llama.cpp's %d, neither %d; "
                   "its largest margin there %.3g" % (tally["tandem"], tally["llama.cpp"], tally["neither"],
                                                      tally["margin"]))
    return "\ndifferences (steps compared):\n" + "\n".join(out) + "\n" if out else ""


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
    ap.add_argument("--llama-threads", type=int, default=0,
                    help="llama.cpp's threads, 0 = -t (its results do not depend on them: a row's dot products "
                    "are never split between threads; on a loaded machine 1 thread avoids its spinning barriers)")
    ap.add_argument("--eos", type=int, default=0, help="the end-of-generation id (pycode: 0)")
    ap.add_argument("--llama-src", default="/work/peer/llama-2606")
    ap.add_argument("--llama-lib", default="/work/peer/lb/bin")
    ap.add_argument("--out", required=True, help="folder for the raw logs and the summary")
    ap.add_argument("--ref", action="store_true",
                    help="judge each difference by a float64 recomputation (bench/xcheck_eagle3_ref.py; needs numpy)")
    ap.add_argument("--tandem-args", default="", help="more options for both tandem runs (e.g. \"--kv-type f32\")")
    ap.add_argument("--from-logs", action="store_true",
                    help="summarise the logs already in --out (NAME.out / .err, or gzipped), run nothing")
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
    if not args.from_logs:
        build_driver(args, exe)

    N, K, T = str(args.max_tokens), str(args.spec_k), str(args.threads)
    TL = str(args.llama_threads or args.threads)
    raw = {}
    if args.from_logs:  # (the runs' outputs as an earlier run wrote them, or gzipped)
        def read(path):
            for p, op in ((path, open), (path + ".gz", gzip.open)):
                if os.path.exists(p):
                    with op(p, "rt") as f:
                        return f.read()
            return ""
        for name in ("llama_spec", "llama_plain", "tandem_spec", "tandem_plain"):
            raw[name] = (read(os.path.join(args.out, name + ".out")), read(os.path.join(args.out, name + ".err")), 0.0)
    else:
        # llama.cpp: speculative, then target-only
        raw["llama_spec"] = run([exe, args.target, args.head, N, K, TL] + files)
        raw["llama_plain"] = run([exe, args.target, "-", N, K, TL] + files)
        # tandem: speculative (the step log on stderr), then target-only
        env = dict(os.environ, TANDEM_SCHED_LOG="1")
        common = ["--prompts", os.path.join(args.work, "prompts.jsonl"), "-n", N, "-t", T, "--temp", "0",
                  "--json"] + shlex.split(args.tandem_args)
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
    tot = dict(tok=0, tok_eq=0, steps=0, parted=0, steps_eq=0, acc_eq=0, t_steps=0, t_acc=0, l_steps=0, l_acc=0,
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
        to, lo = o["tandem_spec"], o["llama_spec"]
        both = set(st) & set(sl)
        common_at = sorted(a for a in both if to[:a] == lo[:a])  # (the same text so far)
        tok = tok_eq = steps_eq = acc_eq = 0
        diff_steps = []
        for at in common_at:
            (ct, at_), (cl, al) = st[at], sl[at]
            tok += max(len(ct), len(cl))
            tok_eq += sum(1 for a, b in zip(ct, cl) if a == b)
            steps_eq += ct == cl
            acc_eq += at_ == al
            if ct != cl:
                diff_steps.append((at, ct, cl))
        r = dict(id=prompts[i]["id"], prompt_eq=prompt_eq, out_eq=out_eq, ref_eq=ref_eq,
                 t_steps=len(st), l_steps=len(sl), common=len(common_at), parted=len(both) - len(common_at),
                 steps_eq=steps_eq, acc_eq=acc_eq,
                 tok=tok, tok_eq=tok_eq, t_acc=sum(a for _, a in st.values()), l_acc=sum(a for _, a in sl.values()),
                 diff_steps=diff_steps, outs=o, prompt_ids=tpids[i],
                 ref_out=ref["target_greedy_ids"] if ref else None)
        rows.append(r)
        for key in ("tok", "tok_eq", "steps_eq", "acc_eq", "t_steps", "t_acc", "l_steps", "l_acc", "parted"):
            tot[key] += r[key]
        tot["steps"] += len(common_at)
        tot["only_t"] += len(set(st) - set(sl))
        tot["only_l"] += len(set(sl) - set(st))
        tot["prompt_eq"] += prompt_eq
        tot["out_eq"] += out_eq
        tot["ref_eq"] += ref_eq

    lines = []
    lines.append("| prompt | prompt ids equal | outputs equal (4 runs) | = reference | steps (tandem / llama.cpp / compared) | identical chains | equal accepted | drafted tokens equal | accepted (tandem / llama.cpp) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    yn = lambda b: "yes" if b else "**no**"
    for r in rows:
        lines.append("| %d | %s | %s | %s | %d / %d / %d | %d | %d | %d / %d | %d / %d |" % (
            r["id"], yn(r["prompt_eq"]), yn(r["out_eq"]), yn(r["ref_eq"]), r["t_steps"], r["l_steps"], r["common"],
            r["steps_eq"], r["acc_eq"], r["tok_eq"], r["tok"], r["t_acc"], r["l_acc"]))
    pct = lambda a, b: 100.0 * a / b if b else 0.0
    summary = [
        "prompts %d, max tokens %s, k %s, threads %s (llama.cpp %s), head %s%s" % (
            n, N, K, T, TL, args.head, ", tandem " + args.tandem_args if args.tandem_args else ""),
        "prompt ids equal (tandem = llama.cpp = reference): %d / %d" % (tot["prompt_eq"], n),
        "outputs equal (tandem and llama.cpp, speculative and target-only): %d / %d; = reference: %d / %d" % (
            tot["out_eq"], n, tot["ref_eq"], n),
        "steps: tandem %d, llama.cpp %d; compared (the same place, the same text before it) %d; at the same place "
        "after the outputs parted %d; at one engine's places only: tandem %d, llama.cpp %d" % (
            tot["t_steps"], tot["l_steps"], tot["steps"], tot["parted"], tot["only_t"], tot["only_l"]),
        "drafted tokens equal: %d / %d = %.2f %%" % (tot["tok_eq"], tot["tok"], pct(tot["tok_eq"], tot["tok"])),
        "steps with identical chains: %d / %d = %.2f %%; equal accepted counts: %d / %d = %.2f %%" % (
            tot["steps_eq"], tot["steps"], pct(tot["steps_eq"], tot["steps"]), tot["acc_eq"], tot["steps"],
            pct(tot["acc_eq"], tot["steps"])),
        "mean accepted per step: tandem %.4f (%d / %d), llama.cpp %.4f (%d / %d)" % (
            tot["t_acc"] / max(tot["t_steps"], 1), tot["t_acc"], tot["t_steps"],
            tot["l_acc"] / max(tot["l_steps"], 1), tot["l_acc"], tot["l_steps"]),
    ]
    if not args.from_logs:
        summary.append("seconds: " + ", ".join("%s %.1f" % (k, v[2]) for k, v in raw.items()))
    elif os.path.exists(os.path.join(args.out, "summary.md")):  # (the run's own times)
        summary += [l.rstrip("\n") for l in open(os.path.join(args.out, "summary.md")) if l.startswith("seconds: ")]
    text = "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
    text += differences(args, rows)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    ok = tot["prompt_eq"] == n and tot["out_eq"] == n and tot["steps_eq"] == tot["steps"] == tot["t_steps"] == tot["l_steps"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
