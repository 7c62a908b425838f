#!/usr/bin/env bash
# bench/gpu-ab.sh - two builds of tandem side by side on one GPU machine (a refactor's
# floors: "old and new binaries in one call"), alternated A B A B so that drift hits
# both alike: the pycode pair's speculation (bench_spec, 100 prompts, auto k and
# n-gram 4, both drafts), a Llama-2-7B-shaped F16 file's batch-1 decode (tandem bench),
# batched S_TG at 1 / 8 / 32 / 64 on it, and speculation in a batch on / off
# (bench_batch, the pycode pair).  Each build is a folder holding tandem, bench_spec
# and bench_batch (bench/gpu-pack.sh's layout).
# usage: bench/gpu-ab.sh OLD_DIR NEW_DIR OUT_DIR [MODELS_DIR] [STEPS]
#   STEPS: comma-separated subset of spec,decode,batch,specbatch (default all), and
#          speclog: each build's steps of a lone sequence with n-gram lookups logged (TANDEM_SCHED_LOG=1,
#          draft-xs, 30 prompts, one repetition; not in the default)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
A=$1 B=$2 out=$3 models=${4:-/dev/shm/tandem-ab} steps=${5:-spec,decode,batch,specbatch}
mkdir -p "$out" "$models"
log() { echo "[$(date +%T)] $*" | tee -a "$out/log.txt"; }
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
pyt="$here/models/pycode-target-f16.gguf" pyx="$here/models/pycode-draft-xs-f16.gguf"
pys="$here/models/pycode-draft-s-f16.gguf" prompts="$here/tests/data/prompts-dev.jsonl"
m7="$models/llama2-7b-f16.gguf"
if has spec; then
  for r in 1 2; do
    for v in A B; do
      d=${!v}
      log "bench_spec $v round $r"
      timeout 300 "$d/bench_spec" -m "$pyt" -d "$pyx" -d "$pys" --prompts "$prompts" -n 128 --reps 3 --ks 0 \
        --ngram 4 --backend cuda >"$out/spec-$v-$r.txt" 2>"$out/spec-$v-$r.err" || log "bench_spec $v failed"
    done
  done
fi
if has decode || has batch; then
  [ -f "$m7" ] || { log "synth llama2-7b f16"; "$B/tandem" synth --shape llama2-7b --type f16 "$m7" >"$out/synth.log" 2>&1 || log "synth failed"; }
fi
if has decode; then
  for r in 1 2; do
    for v in A B; do
      d=${!v}
      log "tandem bench 7B f16 $v round $r"
      timeout 300 "$d/tandem" bench -m "$m7" --backend cuda -p 512 -n 128 --reps 3 --json \
        >"$out/decode-$v-$r.json" 2>"$out/decode-$v-$r.err" || log "tandem bench $v failed"
    done
  done
fi
if has batch; then
  for v in A B; do
    d=${!v}
    log "bench_batch 7B f16 $v"
    timeout 600 "$d/bench_batch" -m "$m7" --backend cuda --batch 1,8,32,64 --npp 128 --ntg 128 --reps 3 \
      --json "$out/batch-$v.json" >"$out/batch-$v.md" 2>"$out/batch-$v.err" || log "bench_batch $v failed"
  done
fi
if has specbatch; then
  for v in A B; do
    d=${!v}
    log "bench_batch pycode spec on/off $v"
    timeout 600 "$d/bench_batch" -m "$pyt" -d "$pyx" --prompts "$prompts" --backend cuda --batch 1,2,4,8,16,32,64 \
      --npp 128 --ntg 512 --reps 3 --json "$out/specbatch-$v.json" >"$out/specbatch-$v.md" 2>"$out/specbatch-$v.err" ||
      log "bench_batch pycode $v failed"
  done
fi
if has speclog; then
  for v in A B; do
    d=${!v}
    log "bench_spec with the steps logged, $v"
    TANDEM_SCHED_LOG=1 timeout 300 "$d/bench_spec" -m "$pyt" -d "$pyx" --prompts "$prompts" -n 128 --reps 1 --limit 30 \
      --ks 0 --ngram 4 --backend cuda >"$out/speclog-$v.txt" 2>"$out/speclog-$v.err" || log "bench_spec $v failed"
    grep -E "^\| pycode" "$out/speclog-$v.txt" | tee -a "$out/log.txt"
  done
fi
log done
