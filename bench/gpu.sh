#!/usr/bin/env bash
# bench/gpu.sh - tandem on an NVIDIA GPU, side by side with llama.cpp in the same run:
# the GPU tests, synthetic models with real shapes (tandem synth), tandem's speed on
# them, llama.cpp's llama-bench on the same files, batched throughput against
# llama-batched-bench (and speculation on/off in a batch), and a summary (JSON,
# markdown tables, PNG plots of decode tok/s by model and type, and of throughput and
# per-request latency against the batch size, for both engines).
#
# usage: bench/gpu.sh [options] OUTDIR
#   --bin DIR|TAR.xz   tandem binaries built elsewhere (bench/gpu-pack.sh makes the
#                      tarball: tandem, bench_spec, bench_batch, the CUDA tests and the
#                      libraries they need); default: build/ of this checkout (meson
#                      -Dcuda=enabled)
#   --llama DIR|TAR.xz a llama.cpp source tree (a snapshot of ggerganov/llama.cpp,
#                      trimmed as the README says); built here with CUDA for sm_90 in the
#                      background while tandem runs.  Also $TANDEM_LLAMA_SRC.
#   --llama-bin DIR    prebuilt llama.cpp binaries (llama-bench, llama-batched-bench) instead
#   --models DIR       where the synthetic models go (default /dev/shm/tandem-models
#                      when it has room, else /tmp/tandem-models)
#   --steps LIST       comma-separated subset of: tests,sanitize,synth,tandem,spec,trees,oracle,
#                      serve,tp,llama,batch,summary (trees: chains against token trees on the
#                      pycode pair, outputs checked; oracle: 7B-scale speculation in the
#                      oracle benchmark mode; serve: bench/serve_load.sh; tp: bench/tp_bench.sh
#                      where two GPUs are)
#                      (default tests,synth,tandem,spec,llama,batch,summary; sanitize runs
#                      compute-sanitizer's memcheck and racecheck on the forward's kernels;
#                      batch: bench_batch at batch 1..128 on the Llama-2-7B-shaped F16 file
#                      beside llama-batched-bench, and the pycode pair with speculation off
#                      and on at batch 1..64 on the GPU and 1..16 on the CPU, in OUTDIR/batch)
#   --reps N           repetitions per measurement (default 3)
# Every step's output goes to OUTDIR (logs, one JSON per measurement); a failed step
# is reported and the others still run.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin_src="" llama_src=${TANDEM_LLAMA_SRC:-} llama_bin="" models="" reps=3
steps="tests,synth,tandem,spec,llama,batch,summary"
while [ $# -gt 1 ]; do
  case "$1" in
    --bin) bin_src=$2; shift 2 ;;
    --llama) llama_src=$2; shift 2 ;;
    --llama-bin) llama_bin=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/gpu.sh [options] OUTDIR" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/run.log"; }
t0=$(date +%s)

# ---- binaries ----------------------------------------------------------------
if [ -n "$bin_src" ]; then
  bdir=/tmp/tandem-bin
  rm -rf "$bdir" && mkdir -p "$bdir"
  if [ -d "$bin_src" ]; then cp -r "$bin_src"/. "$bdir"/; else tar -xJf "$bin_src" -C "$bdir"; fi
else
  bdir="$here/build"
  if [ ! -x "$bdir/tandem" ]; then
    log "building tandem (meson, CUDA for sm_90)"
    (cd "$here" && meson setup build -Dcuda=enabled >/dev/null && meson compile -C build) >"$out/build.log" 2>&1 ||
      { log "build failed (build.log)"; exit 1; }
  fi
fi
find_bin() { for d in "$bdir" "$bdir/bench" "$bdir/tests"; do [ -x "$d/$1" ] && { echo "$d/$1"; return; }; done; }
TANDEM=$(find_bin tandem)
[ -n "$TANDEM" ] || { log "no tandem binary in $bdir"; exit 1; }
export LD_LIBRARY_PATH="$bdir/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TDM_MODELS="$here/models" TDM_TEST_DATA="$here/tests/data"
# NCCL does not travel in bench/gpu-pack.sh's tarball: the machine's own (its CUDA, or
# the nvidia-nccl package beside PyTorch)
if ldd "$TANDEM" 2>/dev/null | grep -q 'libnccl.*not found'; then
  for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
      $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
    [ -f "$d/libnccl.so.2" ] && { export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"; break; }
  done
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv >"$out/gpu.txt" 2>&1
log "GPU: $(tail -n 1 "$out/gpu.txt")"

# ---- llama.cpp, built in the background -----------------------------------------
llama_pid=""
LLAMA_BENCH="" LLAMA_BATCHED=""
if has llama || has batch; then
  if [ -n "$llama_bin" ]; then
    LLAMA_BENCH="$llama_bin/llama-bench" LLAMA_BATCHED="$llama_bin/llama-batched-bench"
  elif [ -n "$llama_src" ]; then
    src=/tmp/llama-src
    if [ -d "$llama_src" ]; then src=$llama_src; else rm -rf "$src"; mkdir -p /tmp && tar -xJf "$llama_src" -C /tmp; fi
    log "building llama.cpp ($src) with CUDA for sm_90 in the background"
    (cmake -S "$src" -B /tmp/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
       -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release &&
     cmake --build /tmp/lb -j"$(nproc)" --target llama-bench llama-batched-bench) >"$out/llama-build.log" 2>&1 &
    llama_pid=$!
    LLAMA_BENCH=/tmp/lb/bin/llama-bench LLAMA_BATCHED=/tmp/lb/bin/llama-batched-bench
  else
    log "no llama.cpp source (--llama): llama.cpp is not measured"
  fi
fi
# waits (once) for the background build
wait_llama() {
  [ -n "$llama_pid" ] || return 0
  log "waiting for the llama.cpp build"
  wait "$llama_pid" || log "llama.cpp build failed (llama-build.log)"
  llama_pid=""
}

# ---- tests -----------------------------------------------------------------------
if has tests; then
  for t in test_cuda_kernels test_cuda_fused test_backend_cuda test_cuda_arch test_cuda_eagle3; do
    b=$(find_bin $t)
    [ -n "$b" ] || { log "$t: not built"; continue; }
    log "$t"
    timeout 300 "$b" --jobs 1 >"$out/$t.log" 2>&1
    log "$t: exit $? ($(grep -E 'Synthesis|Tested' "$out/$t.log" | tail -n 1))"
  done
fi
if has sanitize && command -v compute-sanitizer >/dev/null; then
  # the kernels of the forward (attention, the fused blocks, argmax); ${TANDEM_SANITIZE_FILTER} to change
  filter=${TANDEM_SANITIZE_FILTER:-cuda_f*/*}
  for tool in memcheck racecheck; do
    for t in test_cuda_kernels test_cuda_fused; do
      b=$(find_bin $t)
      log "compute-sanitizer --tool $tool $t --filter '$filter'"
      timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$b" --jobs 1 --filter "$filter" >"$out/sanitize-$tool-$t.log" 2>&1
      log "$tool $t: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool-$t.log" | sort | uniq -c | tr '\n' ' '))"
    done
  done
fi

# ---- synthetic models -----------------------------------------------------------------
if [ -z "$models" ]; then
  models=/tmp/tandem-models
  avail=$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1)
  [ -n "$avail" ] && [ "$avail" -gt $((48 * 1024 * 1024)) ] && models=/dev/shm/tandem-models
fi
mkdir -p "$models"
# name shape type
MODELS="llama2-7b-f16 llama2-7b f16
llama2-7b-q8_0 llama2-7b q8_0
llama2-7b-q4_0 llama2-7b q4_0
llama3-8b-f16 llama3-8b f16"
if has synth; then
  while read -r name shape type; do
    [ -f "$models/$name.gguf" ] && continue
    log "synth $shape $type"
    "$TANDEM" synth --shape "$shape" --type "$type" "$models/$name.gguf" >>"$out/synth.log" 2>&1 || log "synth $name failed"
  done <<<"$MODELS"
fi

# ---- tandem ----------------------------------------------------------------------------
if has tandem; then
  while read -r name shape type; do
    [ -f "$models/$name.gguf" ] || continue
    log "tandem bench $name"
    "$TANDEM" bench -m "$models/$name.gguf" --backend cuda -p 512 -n 128 --reps "$reps" --json \
      >"$out/tandem-$name.json" 2>"$out/tandem-$name.err" || log "tandem $name failed: $(tail -n 2 "$out/tandem-$name.err")"
  done <<<"$MODELS"
  log "tandem bench pycode-target"
  "$TANDEM" bench -m "$here/models/pycode-target-f16.gguf" --backend cuda -p 128 -n 128 --reps "$reps" --json \
    >"$out/tandem-pycode-target.json" 2>"$out/tandem-pycode-target.err"
fi
if has spec; then
  b=$(find_bin bench_spec)
  if [ -n "$b" ]; then
    log "bench_spec pycode (greedy, 100 prompts)"
    "$b" -m "$here/models/pycode-target-f16.gguf" -d "$here/models/pycode-draft-xs-f16.gguf" \
      -d "$here/models/pycode-draft-s-f16.gguf" --prompts "$here/tests/data/prompts-dev.jsonl" -n 128 \
      --reps "$reps" --ks 0 --ngram 4 --backend cuda >"$out/spec.txt" 2>"$out/spec.err" || log "bench_spec failed"
  fi
fi

# trees against chains on the pycode pair (every output checked against target-only:
# the table's last column must read 0), then speculation at 7B scale in the oracle
# benchmark mode (controlled acceptance at real cost), 7B and 1.1B / 160M drafts
if has trees; then
  b=$(find_bin bench_spec)
  if [ -n "$b" ]; then
    log "bench_spec pycode: chains k = 1..8 and auto, trees 16 / 32 / auto / 4,2,2,1"
    timeout 900 "$b" -m "$here/models/pycode-target-f16.gguf" -d "$here/models/pycode-draft-s-f16.gguf" \
      --prompts "$here/tests/data/prompts-dev.jsonl" -n 128 --reps 2 --ks 1,2,3,4,5,6,7,8,0 --tree 16,32,-1 \
      --tree-shape 4,2,2,1 --backend cuda >"$out/trees.txt" 2>"$out/trees.err" || log "bench_spec trees failed"
    log "trees: $(grep -c '| 0 of' "$out/trees.txt") speculative configurations with every output equal to target-only"
    # chains and trees with n-gram lookup off and on (trees then merge the lookups:
    # docs/DESIGN.md, "Lookups in trees"), as users run them by default
    log "bench_spec pycode: chains k = 4..6 and auto, trees 8 / 12 / 16 / auto, n-gram lookup off and 4"
    timeout 600 "$b" -m "$here/models/pycode-target-f16.gguf" -d "$here/models/pycode-draft-s-f16.gguf" \
      --prompts "$here/tests/data/prompts-dev.jsonl" -n 128 --reps 2 --ks 4,5,6,0 --ngram 4 --tree 8,12,16,-1 \
      --backend cuda >"$out/trees-lookups.txt" 2>"$out/trees-lookups.err" || log "bench_spec trees (lookups) failed"
    # the same trees of 32 with host candidates (logits downloaded per level): what the
    # device's candidates buy
    log "bench_spec pycode: trees of 32 with host candidates (--host-topk)"
    timeout 300 "$b" -m "$here/models/pycode-target-f16.gguf" \
      -d "$here/models/pycode-draft-s-f16.gguf" --prompts "$here/tests/data/prompts-dev.jsonl" -n 128 --reps 2 \
      --ks 0 --tree 32 --backend cuda --host-topk >"$out/trees-notopk.txt" 2>&1 || log "bench_spec trees (no topk) failed"
  fi
fi
if has oracle; then
  b=$(find_bin bench_spec)
  for pair in "llama2-7b-f16 llama-160m-f16" "llama2-7b-q4_0 llama-160m-q4_0" "llama2-7b-f16 tinyllama-1.1b-f16"; do
    read -r tgt dft <<<"$pair"
    for f in "$tgt" "$dft"; do
      [ -f "$models/$f.gguf" ] && continue
      IFS=- read -r sh1 sh2 ty <<<"$f"
      shape="$sh1-$sh2" type=$ty
      "$TANDEM" synth --shape "$shape" --type "$type" "$models/$f.gguf" >>"$out/synth.log" 2>&1 || log "synth $f failed"
    done
    [ -n "$b" ] && [ -f "$models/$tgt.gguf" ] && [ -f "$models/$dft.gguf" ] || continue
    log "bench_spec oracle $tgt + $dft"
    timeout 900 "$b" -m "$models/$tgt.gguf" -d "$models/$dft.gguf" --prompts "$here/tests/data/prompts-dev.jsonl" \
      --limit 4 -n 96 --reps 1 --ks 0,4 --tree 16,32 --oracle-alpha 0,0.5,0.6,0.7,0.8,0.9 --backend cuda \
      >"$out/oracle-$tgt-$dft.txt" 2>"$out/oracle-$tgt-$dft.err" || log "oracle $tgt + $dft failed"
  done
  # EAGLE-3 heads of the published shapes as drafts (issue 46; chains and head trees of
  # 16 / 32): beside the 160m draft at Llama-2-7B shapes, alone at Llama-3-8B shapes
  for set in "llama2-7b-f16 llama2-7b llama-160m-f16" "llama3-8b-f16 llama3-8b"; do
    read -r tgt hs dft <<<"$set"
    head="eagle3-$hs-f16"
    [ -f "$models/$tgt.gguf" ] || "$TANDEM" synth --shape "${tgt%-f16}" --type f16 "$models/$tgt.gguf" >>"$out/synth.log" 2>&1
    [ -f "$models/$head.gguf" ] || "$TANDEM" synth --shape "eagle3-$hs" --type f16 "$models/$head.gguf" >>"$out/synth.log" 2>&1
    [ -n "$b" ] && [ -f "$models/$tgt.gguf" ] && [ -f "$models/$head.gguf" ] || { log "oracle $tgt + $head: no files"; continue; }
    drafts=(-d "$models/$head.gguf")
    [ -n "$dft" ] && [ -f "$models/$dft.gguf" ] && drafts+=(-d "$models/$dft.gguf")
    log "bench_spec oracle $tgt + $head${dft:+ and $dft}"
    timeout 900 "$b" -m "$models/$tgt.gguf" "${drafts[@]}" --prompts "$here/tests/data/prompts-dev.jsonl" \
      --limit 4 -n 96 --reps 1 --ks 0,4,6 --tree 16,32 --oracle-alpha 0,0.6,0.8,0.9 --backend cuda \
      >"$out/oracle-$tgt-$head.txt" 2>"$out/oracle-$tgt-$head.err" || log "oracle $tgt + $head failed"
  done
fi
# tandem serve under load on the GPU (the pycode pair with speculation on and off, a
# Llama-2-7B-shaped file)
if has serve; then
  log "serve_load (cuda)"
  timeout 1200 bash "$here/bench/serve_load.sh" --backends cuda --tandem "$TANDEM" \
    --llama "$models/llama2-7b-f16.gguf" "$out/serve" >"$out/serve.log" 2>&1 || log "serve_load failed (serve.log)"
fi
# tensor parallelism where two GPUs are here (degree 1 runs in the tests step)
if has tp; then
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    log "tp_bench (13B and 7B shapes, N = 1, 2)"
    timeout 1800 bash "$here/bench/tp_bench.sh" --bin "$(dirname "$TANDEM")" "$out/tp" >"$out/tp.log" 2>&1 ||
      log "tp_bench failed (tp.log)"
  else
    log "tp: one GPU, skipped"
  fi
fi

# ---- llama.cpp -------------------------------------------------------------------------
if has llama && [ -n "$LLAMA_BENCH" ]; then
  wait_llama
  if [ -x "$LLAMA_BENCH" ]; then
    while read -r name shape type; do
      [ -f "$models/$name.gguf" ] || continue
      log "llama-bench $name"
      "$LLAMA_BENCH" -m "$models/$name.gguf" -p 512 -n 128 -ngl 99 -r "$reps" -o json >"$out/llama-$name.json" \
        2>"$out/llama-$name.err" || log "llama-bench $name failed"
    done <<<"$MODELS"
    log "llama-bench pycode-target"
    "$LLAMA_BENCH" -m "$here/models/pycode-target-f16.gguf" -p 128 -n 128 -ngl 99 -r "$reps" -o json \
      >"$out/llama-pycode-target.json" 2>"$out/llama-pycode-target.err"
  fi
fi

# ---- batched throughput ----------------------------------------------------------------
# bench_batch (its header comment defines S_TG and the rest) and llama-batched-bench on the
# same Llama-2-7B-shaped F16 file, 128-token prompts, 128 new tokens; the pycode pair with
# speculation off and on (real prompts) on the GPU and on this machine's CPU.
if has batch; then
  bo="$out/batch"
  mkdir -p "$bo"
  m7="$models/llama2-7b-f16.gguf"
  pyt="$here/models/pycode-target-f16.gguf" pyd="$here/models/pycode-draft-xs-f16.gguf"
  prompts="$here/tests/data/prompts-dev.jsonl"
  b=$(find_bin bench_batch)
  if [ -z "$b" ]; then
    log "bench_batch: not built"
  else
    if [ -f "$m7" ]; then
      log "bench_batch llama2-7b-f16, batch 1,8,32,64,128"
      timeout 1800 "$b" -m "$m7" --backend cuda --batch 1,8,32,64,128 --npp 128 --ntg 128 --reps "$reps" \
        --json "$bo/tandem-llama2-7b-f16.json" >"$bo/tandem-llama2-7b-f16.md" 2>"$bo/tandem-llama2-7b-f16.err" ||
        log "bench_batch llama2-7b-f16 failed: $(tail -n 2 "$bo/tandem-llama2-7b-f16.err")"
      # (every row as alone: 16-row forwards, slow at large batches; up to 32 here)
      log "bench_batch llama2-7b-f16, batch_invariant on, batch 1,8,32"
      timeout 1800 "$b" -m "$m7" --backend cuda --batch 1,8,32 --npp 128 --ntg 128 --reps "$reps" --invariant \
        --json "$bo/tandem-llama2-7b-f16-invariant.json" >"$bo/tandem-llama2-7b-f16-invariant.md" \
        2>"$bo/tandem-llama2-7b-f16-invariant.err" ||
        log "bench_batch llama2-7b-f16 --invariant failed: $(tail -n 2 "$bo/tandem-llama2-7b-f16-invariant.err")"
    else
      log "bench_batch: no $m7 (the synth step writes it)"
    fi
    # (512 new tokens, 5 repetitions: with 128 a pycode batch lasts ~0.1 s, too short to
    # tell 3 % apart)
    log "bench_batch pycode + draft-xs, speculation off/on, GPU, batch 1..64"
    timeout 900 "$b" -m "$pyt" -d "$pyd" --prompts "$prompts" --backend cuda --batch 1,2,4,8,16,32,64 \
      --npp 128 --ntg 512 --reps 5 --json "$bo/tandem-pycode-spec-cuda.json" >"$bo/tandem-pycode-spec-cuda.md" \
      2>"$bo/tandem-pycode-spec-cuda.err" || log "bench_batch pycode (GPU) failed: $(tail -n 2 "$bo/tandem-pycode-spec-cuda.err")"
    log "bench_batch pycode + draft-xs, speculation off/on, CPU ($(nproc) threads), batch 1..16"
    timeout 900 "$b" -m "$pyt" -d "$pyd" --prompts "$prompts" --backend cpu --threads "$(nproc)" --batch 1,2,4,8,16 \
      --npp 128 --ntg 512 --reps 5 --json "$bo/tandem-pycode-spec-cpu.json" >"$bo/tandem-pycode-spec-cpu.md" \
      2>"$bo/tandem-pycode-spec-cpu.err" || log "bench_batch pycode (CPU) failed: $(tail -n 2 "$bo/tandem-pycode-spec-cpu.err")"
  fi
  if [ -n "$LLAMA_BATCHED" ] && [ -f "$m7" ]; then
    wait_llama
    if [ -x "$LLAMA_BATCHED" ]; then
      # one process per repetition (it measures each batch size once); the summary takes medians
      raw=()
      for r in $(seq "$reps"); do
        log "llama-batched-bench llama2-7b-f16, repetition $r/$reps"
        timeout 900 "$LLAMA_BATCHED" -m "$m7" -c 40000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64,128 -ngl 99 \
          --output-format jsonl >"$bo/llama-llama2-7b-f16.$r.out" 2>"$bo/llama-llama2-7b-f16.$r.err" ||
          log "llama-batched-bench failed: $(tail -n 2 "$bo/llama-llama2-7b-f16.$r.err")"
        raw+=("$bo/llama-llama2-7b-f16.$r.out")
      done
      python3 "$here/bench/batch_summary.py" parse-llama --out "$bo/llama-llama2-7b-f16.json" \
        --command "llama-batched-bench -m $m7 -c 40000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64,128 -ngl 99 --output-format jsonl" \
        "${raw[@]}" 2>>"$bo/llama-llama2-7b-f16.1.err" || log "parsing llama-batched-bench's output failed"
    fi
  fi
fi

# ---- summary ---------------------------------------------------------------------------
if has summary; then
  python3 "$here/bench/gpu_summary.py" "$out" >"$out/summary.md" 2>"$out/summary.err" || log "summary failed"
  if ls "$out"/batch/*.json >/dev/null 2>&1; then
    { echo; python3 "$here/bench/batch_summary.py" "$out/batch"; } >>"$out/summary.md" 2>>"$out/summary.err" ||
      log "batch summary failed"
  fi
  cat "$out/summary.md"
fi
log "done in $(( $(date +%s) - t0 )) s"
