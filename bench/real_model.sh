#!/usr/bin/env bash
# bench/real_model.sh - tandem beside llama.cpp on one real published GGUF, in the same
# run, alternated: prefill and decode tok/s (tandem bench / llama-bench -fa 1, the same
# prompt and generation lengths and threads) and each process's peak RSS, medians over
# the rounds.
#
# usage: bench/real_model.sh [options] OUTDIR
#   --model FILE      the GGUF (default models/real/SmolLM2-135M-Instruct.Q4_1.gguf:
#                     scripts/get-real-model.sh fetches it)
#   --tandem FILE     the tandem binary (default build/tandem, else build-cpu/tandem)
#   --llama-bin DIR   llama.cpp's binaries (llama-bench); required
#   --backend B       cpu or cuda (default cpu; cuda: llama-bench -ngl 99)
#   --threads N       CPU threads for both (default: all cores)
#   --rounds R        alternated rounds (default 5); each round runs each engine once
#                     with 1 repetition
#   --prompt N        prompt tokens (default 128)
#   --gen N           generated tokens (default 128)
# e.g. the issue-44 target: bench/real_model.sh --model models/real/qwen2.5-coder-1.5b-
#   instruct-q4_k_m.gguf --llama-bin /work/peer/lb/bin --threads 2 --prompt 64 OUT
# Writes OUTDIR/real-model.json (every sample) and prints a markdown table.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=$here/models/real/SmolLM2-135M-Instruct.Q4_1.gguf tandem="" llama_bin="" backend=cpu
threads=$(nproc) rounds=5 pp=128 tg=128
while [ $# -gt 1 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --tandem) tandem=$2; shift 2 ;;
    --llama-bin) llama_bin=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prompt) pp=$2; shift 2 ;;
    --gen) tg=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/real_model.sh [options] OUTDIR" >&2; exit 2; }
[ -n "$llama_bin" ] && [ -x "$llama_bin/llama-bench" ] || { echo "error: --llama-bin DIR with llama-bench is required" >&2; exit 2; }
[ -f "$model" ] || { echo "error: $model is absent (scripts/get-real-model.sh)" >&2; exit 2; }
if [ -z "$tandem" ]; then
  for c in "$here/build/tandem" "$here/build-cpu/tandem"; do [ -x "$c" ] && { tandem=$c; break; }; done
fi
[ -x "$tandem" ] || { echo "error: no tandem binary (--tandem FILE)" >&2; exit 2; }
case "$backend" in cpu) ngl=0 ;; cuda) ngl=99 ;; *) echo "error: --backend cpu|cuda" >&2; exit 2 ;; esac
out=$(mkdir -p "$1" && cd "$1" && pwd)
samples=$out/samples.jsonl
: >"$samples"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$tandem" bench -m "$model" -p "$pp" -n "$tg" --threads "$threads" --backend "$backend" --reps 1 --json 2>>"$out/tandem.log" |
    python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print(json.dumps({"engine":"tandem","pp":j["prefill_tok_s"],"tg":j["decode_tok_s"],"rss":j.get("peak_rss_mb")}))' >>"$samples"
  # peak RSS of llama-bench by time(1) (its %M in KiB, on stderr after the log)
  /usr/bin/time -f "maxrss_kb %M" -o "$out/llama.rss" \
    "$llama_bin/llama-bench" -m "$model" -p "$pp" -n "$tg" -fa 1 -t "$threads" -ngl "$ngl" -r 1 -o json 2>>"$out/llama.log" |
    python3 -c '
import json, sys
pp = tg = None
for t in json.loads(sys.stdin.read()):
    if t["n_gen"] == 0: pp = t["avg_ts"]
    else: tg = t["avg_ts"]
rss = None
for l in open(sys.argv[1]):
    if l.startswith("maxrss_kb"): rss = int(l.split()[1]) / 1024.0
print(json.dumps({"engine": "llama.cpp", "pp": pp, "tg": tg, "rss": rss}))' "$out/llama.rss" >>"$samples"
done
python3 - "$samples" "$out/real-model.json" "$model" "$backend" "$threads" "$rounds" "$pp" "$tg" <<'PY'
import json, os, statistics, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
res = {"model": os.path.basename(sys.argv[3]), "backend": sys.argv[4], "threads": int(sys.argv[5]),
       "rounds": int(sys.argv[6]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "samples": rows}
med = {}
for eng in ("tandem", "llama.cpp"):
    med[eng] = {}
    for k in ("pp", "tg", "rss"):
        v = [r[k] for r in rows if r["engine"] == eng and r.get(k) is not None]
        med[eng][k] = statistics.median(v) if v else None
res["median"] = med
json.dump(res, open(sys.argv[2], "w"), indent=1)
print("%s, %s, %d threads, %d alternated rounds, medians (%s)" % (res["model"], res["backend"], res["threads"], res["rounds"], res["date"]))
print()
print("| work | llama.cpp | tandem | ratio |")
print("|---|---:|---:|---:|")
for k, name in (("pp", "prefill %s tok/s" % sys.argv[7]), ("tg", "decode %s tok/s" % sys.argv[8]), ("rss", "peak RSS MB")):
    a, b = med["llama.cpp"][k], med["tandem"][k]
    if a is None or b is None: print("| %s | %s | %s | |" % (name, a, b)); continue
    print("| %s | %.1f | %.1f | %.2fx |" % (name, a, b, b / a))
PY
