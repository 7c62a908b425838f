#!/usr/bin/env bash
# bench/real_model.sh - tandem beside llama.cpp on one real published GGUF, in the same
# run, alternated: prefill and decode tok/s (tandem bench / llama-bench, the same prompt
# and generation lengths and threads), medians over the rounds.
#
# usage: bench/real_model.sh [options] OUTDIR
#   --model FILE      the GGUF (default models/real/SmolLM2-135M-Instruct.Q4_1.gguf:
#                     scripts/get-real-model.sh fetches it)
#   --tandem FILE     the tandem binary (default build/tandem, else build-cpu/tandem)
#   --llama-bin DIR   llama.cpp's binaries (llama-bench); required
#   --backend B       cpu or cuda (default cpu; cuda: llama-bench -ngl 99)
#   --threads N       CPU threads for both (default: all cores)
#   --rounds R        alternated rounds (default 5); each round runs each engine once
#                     with 1 repetition; -p 128 -n 128
# Writes OUTDIR/real-model.json (every sample) and prints a markdown table.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=$here/models/real/SmolLM2-135M-Instruct.Q4_1.gguf tandem="" llama_bin="" backend=cpu
threads=$(nproc) rounds=5
while [ $# -gt 1 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --tandem) tandem=$2; shift 2 ;;
    --llama-bin) llama_bin=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
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
  "$tandem" bench -m "$model" -p 128 -n 128 --threads "$threads" --backend "$backend" --reps 1 --json 2>>"$out/tandem.log" |
    python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print(json.dumps({"engine":"tandem","pp":j["prefill_tok_s"],"tg":j["decode_tok_s"]}))' >>"$samples"
  "$llama_bin/llama-bench" -m "$model" -p 128 -n 128 -t "$threads" -ngl "$ngl" -r 1 -o json 2>>"$out/llama.log" |
    python3 -c '
import json, sys
pp = tg = None
for t in json.loads(sys.stdin.read()):
    if t["n_gen"] == 0: pp = t["avg_ts"]
    else: tg = t["avg_ts"]
print(json.dumps({"engine": "llama.cpp", "pp": pp, "tg": tg}))' >>"$samples"
done
python3 - "$samples" "$out/real-model.json" "$model" "$backend" "$threads" "$rounds" <<'PY'
import json, os, statistics, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
res = {"model": os.path.basename(sys.argv[3]), "backend": sys.argv[4], "threads": int(sys.argv[5]),
       "rounds": int(sys.argv[6]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "samples": rows}
med = {}
for eng in ("tandem", "llama.cpp"):
    med[eng] = {k: statistics.median([r[k] for r in rows if r["engine"] == eng and r[k] is not None]) for k in ("pp", "tg")}
res["median"] = med
json.dump(res, open(sys.argv[2], "w"), indent=1)
print("%s, %s, %d threads, %d alternated rounds, medians (%s)" % (res["model"], res["backend"], res["threads"], res["rounds"], res["date"]))
print()
print("| work | llama.cpp tok/s | tandem tok/s | ratio |")
print("|---|---:|---:|---:|")
for k, name in (("pp", "prefill 128"), ("tg", "decode 128")):
    a, b = med["llama.cpp"][k], med["tandem"][k]
    print("| %s | %.1f | %.1f | %.2fx |" % (name, a, b, b / a))
PY
