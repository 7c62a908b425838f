#!/usr/bin/env bash
# bench/tp_bench.sh - tensor parallelism on a multi-GPU machine: Llama-2-13B and
# Llama-2-7B shapes (F16, random weights from `tandem synth`), decode at batch 1 with
# the target split N = 1 and N = 2 ways (tandem bench, alternated rounds, medians),
# and the throughput at batch 64 (bench_batch S_TG).  Writes OUTDIR/tp.json (every
# sample), OUTDIR/tp.md (the table) and prints the table.
#
# usage: bench/tp_bench.sh [--bin DIR] [--rounds R] [--shapes llama2-13b,llama2-7b] [--degrees 1,2]
#                          [--backend cuda] [--batch 64] [-n 128] OUTDIR
#   --bin DIR   where tandem and bench/bench_batch are (default build/)
#   --backend   cuda (default), or cpu for a smoke run of the script itself
#   --batch B   the throughput row's batch (default 64); -n N: tokens generated (128)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build rounds=3 shapes=llama2-13b,llama2-7b degrees=1,2 backend=cuda batch=64 ntg=128
while [ $# -gt 1 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --degrees) degrees=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    -n) ntg=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/tp_bench.sh [options] OUTDIR" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
samples=$out/samples.jsonl
: >"$samples"
IFS=, read -ra shape_list <<<"$shapes"
IFS=, read -ra degree_list <<<"$degrees"
for shape in "${shape_list[@]}"; do
  model=$out/$shape-f16.gguf
  [ -f "$model" ] || "$bin/tandem" synth --shape "$shape" --type f16 "$model" >&2 || exit 1
  for ((r = 1; r <= rounds; r++)); do
    for n in "${degree_list[@]}"; do
      echo "[$shape] round $r/$rounds, tensor parallel $n" >&2
      j=$(timeout 600 "$bin/tandem" bench -m "$model" --backend "$backend" --tensor-parallel "$n" -p 128 -n "$ntg" --reps 1 --json) ||
        { echo "error: tandem bench failed ($shape, N = $n)" >&2; continue; }
      echo "{\"shape\": \"$shape\", \"n\": $n, \"kind\": \"decode\", \"bench\": $j}" >>"$samples"
    done
  done
  for n in "${degree_list[@]}"; do
    timeout 600 "$bin/bench/bench_batch" -m "$model" --backend "$backend" --tensor-parallel "$n" --batch "$batch" \
      --npp 128 --ntg "$ntg" --reps 1 --json "$out/batch-$shape-$n.json" >&2 || { echo "error: bench_batch failed" >&2; continue; }
    echo "{\"shape\": \"$shape\", \"n\": $n, \"kind\": \"batch\", \"batch\": $batch, \"bench\": $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$out/batch-$shape-$n.json")}" >>"$samples"
  done
done
python3 - "$samples" "$out/tp.md" "$batch" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
dec, bat = {}, {}
for r in rows:
    k = (r["shape"], r["n"])
    if r["kind"] == "decode":
        dec.setdefault(k, []).append(r["bench"]["decode_tok_s"])
    else:
        for c in r["bench"].get("runs", []):
            if c.get("batch") == int(sys.argv[3]):
                bat[k] = c["median"]["s_tg"]
lines = ["| shape | N | decode tok/s (batch 1, median) | speed-up vs N = 1 | batch %s S_TG tok/s | GPU MB per rank |" % sys.argv[3],
         "|---|---|---|---|---|---|"]
for (shape, n) in sorted(dec):
    m = statistics.median(dec[(shape, n)])
    base = statistics.median(dec[(shape, 1)]) if (shape, 1) in dec else 0
    mem = [r["bench"].get("peak_gpu_mb_per_rank", []) for r in rows if r["shape"] == shape and r["n"] == n and r["kind"] == "decode"]
    lines.append("| %s | %d | %.1f | %s | %s | %s |" % (shape, n, m, "%.2fx" % (m / base) if base else "-",
                 "%.0f" % bat[(shape, n)] if (shape, n) in bat else "-", ", ".join("%.0f" % x for x in mem[-1]) if mem else "-"))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
