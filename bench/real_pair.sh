#!/usr/bin/env bash
# bench/real_pair.sh - tandem beside llama.cpp on the real published pair (target
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M, draft Qwen2.5-Coder-0.5B-Instruct Q4_K_M:
# scripts/get-real-pair.sh fetches them), the same files, prompts and threads, on the
# CPU, alternated in each round (A B A B):
#   plain      prefill and decode of the target alone: tandem bench -p P -n N /
#              llama-bench -p P -n N -fa 1 (synthetic prompt, -n tokens);
#   speculative  greedy decoding of the code prompts of PROMPTS (N new tokens each, to
#              an end-of-generation token at most), with the draft: tandem bench -d
#              --prompts (tandem's defaults: adaptive k, n-gram lookups) /
#              llama-speculative --spec-draft-n-max 8 --temp 0 --top-k 1, one run per
#              prompt; decode tok/s over all prompts, acceptance (accepted / drafted);
#   peak RSS   of every run (/usr/bin/time -v: the maximum resident set size).
# Both engines run at their default context and KV type (tandem: min(4096, the
# model's context) and f16 on the CPU).
# Medians over the rounds; the floors the table reports: speculative >= 1.6x tandem's
# own plain decode and >= 1.3x the best llama.cpp reaches (its plain decode or its
# speculation); peak RSS <= llama.cpp's + 10 %.
#
# usage: bench/real_pair.sh [options] OUTDIR
#   --target FILE     default models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
#   --draft FILE      default models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#   --prompts FILE    JSON lines {"prompt": ...} (default bench/real-pair-prompts.jsonl:
#                     8 code prompts)
#   --tandem FILE     the tandem binary (default build/tandem, else build-nc/tandem,
#                     build-cpu/tandem)
#   --llama-bin DIR   llama.cpp's binaries (llama-bench, llama-speculative); required
#   --threads N       CPU threads for both, the draft's too (default 2)
#   --rounds R        alternated rounds (default 3)
#   -p N, -n N        plain prompt / new tokens (default 128 / 128; -n also the
#                     speculative new tokens per prompt)
# Writes OUTDIR/samples.jsonl (every sample), OUTDIR/real-pair.json (samples and
# medians), OUTDIR/real-pair.md (the table) and, with matplotlib, OUTDIR/real-pair.png
# (bench/real_pair_plot.py); prints the table.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=$here/models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
draft=$here/models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
prompts=$here/bench/real-pair-prompts.jsonl
tandem="" llama_bin="" threads=2 rounds=3 np=128 nn=128
while [ $# -gt 1 ]; do
  case "$1" in
    --target) target=$2; shift 2 ;;
    --draft) draft=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --tandem) tandem=$2; shift 2 ;;
    --llama-bin) llama_bin=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -p) np=$2; shift 2 ;;
    -n) nn=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/real_pair.sh [options] OUTDIR" >&2; exit 2; }
[ -n "$llama_bin" ] && [ -x "$llama_bin/llama-bench" ] && [ -x "$llama_bin/llama-speculative" ] ||
  { echo "error: --llama-bin DIR with llama-bench and llama-speculative is required" >&2; exit 2; }
for f in "$target" "$draft"; do
  [ -f "$f" ] || { echo "error: $f is absent (scripts/get-real-pair.sh)" >&2; exit 2; }
done
[ -f "$prompts" ] || { echo "error: $prompts is absent" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time is needed for peak RSS (apt-get install time)" >&2; exit 2; }
if [ -z "$tandem" ]; then
  for c in "$here/build/tandem" "$here/build-nc/tandem" "$here/build-cpu/tandem"; do
    [ -x "$c" ] && { tandem=$c; break; }
  done
fi
[ -x "$tandem" ] || { echo "error: no tandem binary (--tandem FILE)" >&2; exit 2; }
for v in "$threads" "$rounds" "$np" "$nn"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "error: --threads, --rounds, -p and -n take positive integers" >&2; exit 2; }
done
out=$(mkdir -p "$1" && cd "$1" && pwd)
samples=$out/samples.jsonl
: >"$samples"
log=$out/run.log
: >"$log"

# rss_mb TIMEFILE: the maximum resident set size /usr/bin/time -v wrote, in MB
rss_mb() { awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$1"; }

# The prompts one per file (llama-speculative takes the text with -f).
pdir=$out/prompts
mkdir -p "$pdir"
n_prompts=$(python3 - "$prompts" "$pdir" <<'PY'
import json, sys
n = 0
for line in open(sys.argv[1], encoding="utf-8"):
    if line.strip():
        with open("%s/%d.txt" % (sys.argv[2], n), "w", encoding="utf-8") as f:
            f.write(json.loads(line)["prompt"])
        n += 1
print(n)
PY
)

tandem_plain() {
  /usr/bin/time -v -o "$out/time.txt" "$tandem" bench -m "$target" -p "$np" -n "$nn" --threads "$threads" --reps 1 \
    --json >"$out/t.json" 2>>"$log" || { echo "tandem bench failed (see $log)" >&2; return 1; }
  python3 - "$out/t.json" "$(rss_mb "$out/time.txt")" <<'PY' >>"$samples"
import json, sys
j = json.load(open(sys.argv[1]))
print(json.dumps({"engine": "tandem", "work": "plain", "pp": j["prefill_tok_s"], "tg": j["decode_tok_s"],
                  "rss_mb": float(sys.argv[2])}))
PY
}

llama_plain() {
  /usr/bin/time -v -o "$out/time.txt" "$llama_bin/llama-bench" -m "$target" -p "$np" -n "$nn" -t "$threads" -fa 1 \
    -r 1 -o json >"$out/l.json" 2>>"$log" || { echo "llama-bench failed (see $log)" >&2; return 1; }
  python3 - "$out/l.json" "$(rss_mb "$out/time.txt")" <<'PY' >>"$samples"
import json, sys
pp = tg = None
for t in json.load(open(sys.argv[1])):
    if t["n_gen"] == 0: pp = t["avg_ts"]
    else: tg = t["avg_ts"]
print(json.dumps({"engine": "llama.cpp", "work": "plain", "pp": pp, "tg": tg, "rss_mb": float(sys.argv[2])}))
PY
}

tandem_spec() {
  /usr/bin/time -v -o "$out/time.txt" "$tandem" bench -m "$target" -d "$draft" --prompts "$prompts" -n "$nn" \
    --threads "$threads" --json >"$out/t.json" 2>>"$log" || { echo "tandem bench -d failed (see $log)" >&2; return 1; }
  python3 - "$out/t.json" "$(rss_mb "$out/time.txt")" <<'PY' >>"$samples"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["spec"]
print(json.dumps({"engine": "tandem", "work": "spec", "tg": j["decode_tok_s"], "tokens": j["generated_tokens"],
                  "acceptance": s["acceptance_rate"], "drafted": s["drafted"], "accepted": s["accepted"],
                  "rss_mb": float(sys.argv[2])}))
PY
}

# one llama-speculative run per prompt; decode tok/s = all tokens / all decode time
llama_spec() {
  local i f rss=0 r
  : >"$out/ls.txt"
  for ((i = 0; i < n_prompts; i++)); do
    f=$out/ls-$i.txt
    /usr/bin/time -v -o "$out/time.txt" "$llama_bin/llama-speculative" -m "$target" -md "$draft" -f "$pdir/$i.txt" \
      -n "$nn" --spec-draft-n-max 8 --temp 0 --top-k 1 -t "$threads" -td "$threads" >"$f" 2>&1 ||
      { echo "llama-speculative failed (see $f)" >&2; return 1; }
    r=$(rss_mb "$out/time.txt")
    rss=$(python3 -c "print(max($rss, $r))")
    grep -E "decoded +[0-9]+ tokens in|n_drafted|n_accept " "$f" >>"$out/ls.txt"
  done
  python3 - "$out/ls.txt" "$rss" <<'PY' >>"$samples"
import re, sys
toks = secs = drafted = accepted = 0
for line in open(sys.argv[1]):
    m = re.search(r"decoded +(\d+) tokens in +([\d.]+) seconds", line)
    if m:
        toks += int(m.group(1)); secs += float(m.group(2))
    m = re.search(r"n_drafted += (\d+)", line)
    if m: drafted += int(m.group(1))
    m = re.search(r"n_accept += (\d+)", line)
    if m: accepted += int(m.group(1))
import json
print(json.dumps({"engine": "llama.cpp", "work": "spec", "tg": toks / secs, "tokens": toks,
                  "acceptance": accepted / drafted if drafted else 0.0, "drafted": drafted, "accepted": accepted,
                  "rss_mb": float(sys.argv[2])}))
PY
}

# every sample notes the 1-minute load average at its end (a shared machine shows here)
note_load() {
  python3 - "$samples" <<'PY'
import json, sys
rows = open(sys.argv[1]).read().splitlines()
last = json.loads(rows[-1])
last["load1"] = float(open("/proc/loadavg").read().split()[0])
rows[-1] = json.dumps(last)
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
}

for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  tandem_plain && note_load || exit 1
  llama_plain && note_load || exit 1
  tandem_spec && note_load || exit 1
  llama_spec && note_load || exit 1
done

python3 - "$samples" "$out" "$target" "$draft" "$threads" "$rounds" "$np" "$nn" "$n_prompts" <<'PY'
import json, os, statistics, sys, time
samples, out = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(samples) if l.strip()]
res = {"target": os.path.basename(sys.argv[3]), "draft": os.path.basename(sys.argv[4]), "backend": "cpu",
       "threads": int(sys.argv[5]), "rounds": int(sys.argv[6]), "prompt_tokens": int(sys.argv[7]),
       "new_tokens": int(sys.argv[8]), "n_prompts": int(sys.argv[9]),
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "samples": rows}
med = {}
for eng in ("tandem", "llama.cpp"):
    for work in ("plain", "spec"):
        sel = [r for r in rows if r["engine"] == eng and r["work"] == work]
        med["%s %s" % (eng, work)] = {k: statistics.median([r[k] for r in sel]) for k in sel[0]
                                      if isinstance(sel[0][k], (int, float)) and k not in ("drafted", "accepted")}
loads = [r["load1"] for r in rows if "load1" in r]
res["median"] = med
T, L = lambda w: med["tandem " + w], lambda w: med["llama.cpp " + w]
best_llama = max(L("plain")["tg"], L("spec")["tg"])
rss_t = max(T("plain")["rss_mb"], T("spec")["rss_mb"])
rss_l = max(L("plain")["rss_mb"], L("spec")["rss_mb"])
floors = [
    ("speculative / tandem plain decode", T("spec")["tg"] / T("plain")["tg"], ">= 1.6x", T("spec")["tg"] / T("plain")["tg"] >= 1.6),
    ("speculative / best llama.cpp decode", T("spec")["tg"] / best_llama, ">= 1.3x", T("spec")["tg"] / best_llama >= 1.3),
    ("peak RSS / llama.cpp's", rss_t / rss_l, "<= 1.10x", rss_t <= 1.10 * rss_l),
    ("prefill / llama.cpp's", T("plain")["pp"] / L("plain")["pp"], "(reported)", None),
    ("plain decode / llama.cpp's", T("plain")["tg"] / L("plain")["tg"], "(reported)", None),
]
res["floors"] = [{"what": w, "ratio": round(v, 3), "floor": f, "met": m} for w, v, f, m in floors]
json.dump(res, open(os.path.join(out, "real-pair.json"), "w"), indent=1)
lines = ["%s + %s, CPU, %d threads, %d alternated rounds, medians (%s); load average %.1f-%.1f during "
         "the runs" % (res["target"], res["draft"], res["threads"], res["rounds"], res["date"], min(loads),
                       max(loads)), "",
         "| work | llama.cpp | tandem | ratio |", "|---|---:|---:|---:|"]
def row(name, a, b, unit, fmt="%.1f"):
    lines.append("| %s | %s %s | %s %s | %.2fx |" % (name, fmt % a, unit, fmt % b, unit, b / a))
row("prefill %d (plain)" % res["prompt_tokens"], L("plain")["pp"], T("plain")["pp"], "tok/s")
row("decode %d (plain)" % res["new_tokens"], L("plain")["tg"], T("plain")["tg"], "tok/s")
row("speculative decode, %d code prompts x %d" % (res["n_prompts"], res["new_tokens"]), L("spec")["tg"],
    T("spec")["tg"], "tok/s")
row("acceptance (accepted / drafted)", L("spec")["acceptance"], T("spec")["acceptance"], "", "%.3f")
row("peak RSS, plain", L("plain")["rss_mb"], T("plain")["rss_mb"], "MB", "%.0f")
row("peak RSS, speculative", L("spec")["rss_mb"], T("spec")["rss_mb"], "MB", "%.0f")
lines += ["", "| floor | value | wanted | met |", "|---|---:|---|---|"]
for w, v, f, m in floors:
    lines.append("| %s | %.2fx | %s | %s |" % (w, v, f, "-" if m is None else ("yes" if m else "**no**")))
text = "\n".join(lines) + "\n"
open(os.path.join(out, "real-pair.md"), "w").write(text)
print(text)
PY
python3 "$here/bench/real_pair_plot.py" "$out/real-pair.json" "$out/real-pair.png" || true
