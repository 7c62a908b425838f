#!/usr/bin/env bash
# bench/mem_real.sh - peak resident memory of tandem and llama.cpp on the real
# Qwen2.5-Coder pair, at the same context and the same tokens held: GNU time's
# "Maximum resident set size" of each run, one run per engine and case (memory does
# not vary with the machine's load as times do).  Prints a markdown table.
#
# usage: bench/mem_real.sh [--tandem FILE] [--llama-bin DIR] [--ctx N] [--threads T]
#                          [--cases full,short,long]
#   --tandem FILE     the tandem binary (default build/tandem, else build-nc/tandem)
#   --llama-bin DIR   llama.cpp's binaries (llama-bench, llama-speculative); default
#                     /work/peer/lb/bin
#   --ctx N           the context of every run (default 4096)
#   --threads T       threads of both (default 2)
#   --cases LIST      the cases below to run (default all three)
# Cases:
#   target, context full: tandem bench -p (N - 64) -n 64 --ctx N  beside
#     llama-bench -pg (N - 64),64 (a context of exactly N, filled)
#   target + draft, short prompt: tandem generate -d, a 150-token prompt, 64 tokens,
#     --ctx N  beside  llama-speculative -c N -b N (the same prompt and tokens, greedy;
#     its batch holds the whole prompt)
#   target + draft, long prompt: the same with a prompt of about N - 600 tokens
#     (the README's first characters, cut to that many tokens)
# The models: models/real/qwen2.5-coder-{1.5b,0.5b}-instruct-q4_k_m.gguf.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tandem="" llama_bin=/work/peer/lb/bin ctx=4096 threads=2 cases=full,short,long
while [ $# -gt 0 ]; do
  case "$1" in
    --tandem) tandem=$2; shift 2 ;;
    --llama-bin) llama_bin=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$tandem" ]; then
  for b in "$here/build/tandem" "$here/build-nc/tandem"; do [ -x "$b" ] && tandem=$b && break; done
fi
T=$here/models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
D=$here/models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
for f in "$tandem" "$llama_bin/llama-bench" "$llama_bin/llama-speculative" "$T" "$D"; do
  [ -e "$f" ] || { echo "error: $f is missing" >&2; exit 1; }
done
export LD_LIBRARY_PATH=$llama_bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# peak RSS in MB (10^6 bytes) of a command; its output kept in $tmp/last.log
peak() {
  /usr/bin/time -v "$@" >"$tmp/last.log" 2>&1 || {
    echo "error: $(basename "$1") $2 failed:" >&2
    grep -v '^\s' "$tmp/last.log" | tail -3 >&2
    echo "-"
    return
  }
  awk '/Maximum resident set size/ {printf "%.0f", $NF * 1024 / 1e6}' "$tmp/last.log"
}

short="Write a C function that parses an ISO 8601 date string into a struct tm, with error handling, and explain each step."
short=$(for i in 1 2 3 4 5 6; do printf '%s ' "$short"; done)
ntok() { "$tandem" tokenize -m "$T" --text "$1" | tr -cd ',' | wc -c; }
# a long prompt: the README's first characters, about ctx - 600 tokens (one
# correction of a first guess of 3 characters a token)
want=$((ctx - 600)) chars=$(((ctx - 600) * 3))
long=$(head -c "$chars" "$here/README.md")
chars=$((chars * want / ($(ntok "$long") + 1)))
long=$(head -c "$chars" "$here/README.md")
n_short=$(ntok "$short") n_long=$(ntok "$long")

echo "| case (context $ctx, $threads threads) | tandem MB | llama.cpp MB | tandem / llama.cpp |"
echo "|---|---:|---:|---:|"
row() {
  local r
  if [ "$2" = - ] || [ "$3" = - ]; then r="-"; else r=$(awk -v a="$2" -v b="$3" 'BEGIN {printf "%.2f", a / b}'); fi
  echo "| $1 | $2 | $3 | $r |"
}
p=$((ctx - 64))
case ",$cases," in *,full,*)
a=$(peak "$tandem" bench -m "$T" -p $p -n 64 --ctx "$ctx" --reps 1 -t "$threads")
b=$(peak "$llama_bin/llama-bench" -m "$T" -pg $p,64 -p 0 -n 0 -r 1 --no-warmup -fa 1 -t "$threads")
row "target, context full ($p + 64 tokens)" "$a" "$b" ;;
esac
for c in short long; do
  case ",$cases," in *,$c,*) ;; *) continue ;; esac
  text=${!c}
  n=$([ $c = short ] && echo $((n_short + 1)) || echo $((n_long + 1)))
  a=$(peak "$tandem" generate -m "$T" -d "$D" --ctx "$ctx" -p "$text" -n 64 -t "$threads")
  b=$(peak "$llama_bin/llama-speculative" -m "$T" -md "$D" -c "$ctx" -b "$ctx" -p "$text" -n 64 -t "$threads" \
      -fa on --temp 0 -s 1)
  row "target + draft, $c prompt (~$n + 64 tokens)" "$a" "$b"
done
