#!/bin/bash
# alternated: tandem bench / llama-bench on the same file, 2 threads
F=${1:-/tmp/moe/qs.gguf}; R=${2:-3}; T=/work/wt/moe/build-nc/tandem; L=/work/peer/lb/bin/llama-bench
for r in $(seq 1 $R); do
  echo "round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  $T bench -m $F -p 512 -n 1 --threads 2 --reps 1 2>&1 | grep -E "prefill:" | sed 's/^/  tandem /'
  $L -m $F -p 512 -n 0 -fa 1 -t 2 -r 1 -o csv 2>/dev/null | tail -1 | awk -F, '{print "  llama  pp512 " $(NF-1)}'
  $T bench -m $F -p 8 -n 128 --threads 2 --reps 1 2>&1 | grep -E "decode:" | sed 's/^/  tandem /'
  $L -m $F -p 0 -n 128 -fa 1 -t 2 -r 1 -o csv 2>/dev/null | tail -1 | awk -F, '{print "  llama  tg128 " $(NF-1)}'
done
