#!/usr/bin/env bash
# bench/draft_vocab.sh - speculative decoding with the draft's head over part of the
# vocabulary (--draft-vocab N: ids [0, N) and the special tokens; 0 = the whole head),
# greedy, on the CPU: tandem bench -d --prompts PROMPTS -n N for each value, the values
# alternated in every round (A B C D A B C D ...), and one plain decode of the target
# (tandem bench -p 128 -n N) per round for the speed-up's base.  Medians over the
# rounds of decode tok/s, acceptance (accepted / drafted) and drafted tokens.
#
# usage: bench/draft_vocab.sh [options] OUTDIR
#   --target FILE     default models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
#   --draft FILE      default models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#   --prompts FILE    default bench/real-pair-prompts.jsonl
#   --tandem FILE     default build-nc/tandem, else build/tandem
#   --values LIST     draft_vocab values, comma-separated (default 0,16384,32768,65536)
#   --threads N       default 2
#   --rounds R        default 3
#   -n N              new tokens per prompt (default 128)
# Writes OUTDIR/samples.jsonl and OUTDIR/draft-vocab.md (the table); prints the table.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=$here/models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
draft=$here/models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
prompts=$here/bench/real-pair-prompts.jsonl
tandem="" values=0,16384,32768,65536 threads=2 rounds=3 nn=128
while [ $# -gt 1 ]; do
  case "$1" in
    --target) target=$2; shift 2 ;;
    --draft) draft=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --tandem) tandem=$2; shift 2 ;;
    --values) values=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n) nn=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/draft_vocab.sh [options] OUTDIR" >&2; exit 2; }
for f in "$target" "$draft" "$prompts"; do
  [ -f "$f" ] || { echo "error: $f is absent" >&2; exit 2; }
done
[ -n "$tandem" ] || { [ -x "$here/build-nc/tandem" ] && tandem=$here/build-nc/tandem || tandem=$here/build/tandem; }
[ -x "$tandem" ] || { echo "error: no tandem binary (--tandem FILE)" >&2; exit 2; }
[[ "$threads $rounds $nn" =~ ^[1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*$ ]] ||
  { echo "error: --threads, --rounds and -n take positive integers" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
samples=$out/samples.jsonl
: >"$samples"
log=$out/run.log
: >"$log"
IFS=, read -r -a vals <<<"$values"

for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$tandem" bench -m "$target" -p 128 -n "$nn" --threads "$threads" --reps 1 --json >"$out/t.json" 2>>"$log" ||
    { echo "tandem bench failed (see $log)" >&2; exit 1; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps({"vocab": "plain", "tg": j["decode_tok_s"]}))' \
    "$out/t.json" >>"$samples"
  for v in "${vals[@]}"; do
    "$tandem" bench -m "$target" -d "$draft" --prompts "$prompts" -n "$nn" --threads "$threads" --draft-vocab "$v" \
      --json >"$out/t.json" 2>>"$log" || { echo "tandem bench -d --draft-vocab $v failed (see $log)" >&2; exit 1; }
    python3 - "$out/t.json" "$v" <<'PY' >>"$samples"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["spec"]
print(json.dumps({"vocab": sys.argv[2], "tg": j["decode_tok_s"], "tokens": j["generated_tokens"],
                  "acceptance": s["acceptance_rate"], "drafted": s["drafted"], "accepted": s["accepted"],
                  "steps": s["steps"]}))
PY
  done
done

python3 - "$samples" "$out" "$values" "$rounds" "$threads" "$nn" <<'PY'
import json, statistics, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
vals = sys.argv[3].split(",")
plain = statistics.median(r["tg"] for r in rows if r["vocab"] == "plain")
lines = ["draft_vocab | spec tok/s (median) | x plain | acceptance | drafted | accepted | tokens",
         "---|---|---|---|---|---|---"]
for v in vals:
    sel = [r for r in rows if r["vocab"] == v]
    med = lambda k: statistics.median(r[k] for r in sel)
    lines.append("%s | %.1f | %.2f | %.3f | %d | %d | %d" % (v, med("tg"), med("tg") / plain, med("acceptance"),
                 med("drafted"), med("accepted"), med("tokens")))
lines.append("plain (target alone) | %.1f | 1.00 | | | |" % plain)
hdr = "%s, %s rounds alternated, %s threads, -n %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                       sys.argv[4], sys.argv[5], sys.argv[6])
text = hdr + "\n\n" + "\n".join(lines) + "\n"
open(sys.argv[2] + "/draft-vocab.md", "w").write(text)
print(text)
PY
