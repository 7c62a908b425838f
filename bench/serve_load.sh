#!/usr/bin/env bash
# bench/serve_load.sh - `tandem serve` under load: for each configuration, starts the
# server, waits for /health, runs bench/serve_bench.py over a concurrency sweep, stops
# the server (SIGTERM); then bench/serve_plot.py draws and tabulates all of them.
#
# usage: bench/serve_load.sh [options] OUTDIR
#   --backends LIST    cpu,cuda (default cpu,cuda)
#   --configs LIST     pycode-spec (target + draft-xs: speculation on), pycode-plain (the
#                      target alone: off), llama2-7b (a Llama-2-7B-shaped F16 file, no
#                      speculation; cuda only) (default: all three)
#   --tandem BIN       the tandem binary (default: build/tandem, else build-cpu/tandem)
#   --bin DIR|TAR.xz   binaries packed by bench/gpu-pack.sh instead (their lib/ goes on
#                      LD_LIBRARY_PATH)
#   --models DIR       the pycode pair (default: models/ of this checkout)
#   --llama FILE       the 7B-shaped file; written with `tandem synth --shape SHAPE --type
#                      f16` when absent (default /dev/shm/tandem-models/llama2-7b-f16.gguf
#                      when /dev/shm has room, else /tmp/tandem-models/..., as bench/gpu.sh)
#   --llama-shape S    the shape for --llama (default llama2-7b; a small one such as
#                      llama-160m tries the path on a CPU)
#   --concurrency L    the sweep (default 1,4,16,32)
#   --num-prompts N    requests per run (default 64; the 7B file: --llama-num-prompts, 32)
#   --max-tokens N     (default 64)
#   --prompts FILE     (default tests/data/prompts-dev.jsonl)
#   --threads N        the CPU backend's threads (default 0 = all cores)
#   --bench-args "..." more serve_bench.py options (e.g. "--temperature 0.7")
# Every configuration writes OUTDIR/LABEL.json (serve_bench's), LABEL.txt (its table)
# and LABEL.server.log, LABEL = CONFIG-BACKEND; OUTDIR/run.log has the commands;
# OUTDIR/serve-latency.png and summary.md come from serve_plot.py ($PLOT_PYTHON: a
# python3 with matplotlib for the PNG, default python3).  A configuration
# that fails is reported and the others still run; exit 1 if any failed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
backends=cpu,cuda configs=pycode-spec,pycode-plain,llama2-7b tandem="" bin_src="" models="$here/models"
llama="" llama_shape=llama2-7b conc=1,4,16,32 nprompts=64 llama_nprompts=32 ntok=64
prompts="$here/tests/data/prompts-dev.jsonl" threads=0 bench_args=""
while [ $# -gt 1 ]; do
  case "$1" in
    --backends) backends=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --tandem) tandem=$2; shift 2 ;;
    --bin) bin_src=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --llama) llama=$2; shift 2 ;;
    --llama-shape) llama_shape=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --num-prompts) nprompts=$2; shift 2 ;;
    --llama-num-prompts) llama_nprompts=$2; shift 2 ;;
    --max-tokens) ntok=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    *) echo "error: unknown option $1 (usage: bench/serve_load.sh [options] OUTDIR)" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/serve_load.sh [options] OUTDIR" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/run.log"; }
in_list() { case ",$2," in *",$1,"*) return 0 ;; esac; return 1; }

if [ -n "$bin_src" ]; then
  bdir=$(mktemp -d /tmp/tandem-serve-bin.XXXXXX)
  if [ -d "$bin_src" ]; then cp -r "$bin_src"/. "$bdir"/; else tar -xJf "$bin_src" -C "$bdir"; fi
  tandem=$bdir/tandem
  export LD_LIBRARY_PATH="$bdir/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
elif [ -z "$tandem" ]; then
  tandem=$here/build/tandem
  [ -x "$tandem" ] || tandem=$here/build-cpu/tandem
fi
[ -x "$tandem" ] || { echo "error: no tandem binary ($tandem); build it or give --tandem / --bin" >&2; exit 1; }
if "$tandem" serve -m /nonexistent --port 0 2>&1 | grep -q "without HTTP support"; then
  echo "error: $tandem was built without HTTP support (libmicrohttpd-dev missing at configure time)" >&2
  exit 1
fi
if [ -z "$llama" ]; then
  d=/tmp/tandem-models
  avail=$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1)
  [ -n "$avail" ] && [ "$avail" -gt $((48 * 1024 * 1024)) ] && d=/dev/shm/tandem-models
  [ "$llama_shape" = llama2-7b ] && llama=$d/llama2-7b-f16.gguf || llama=$d/$llama_shape-f16.gguf
fi
log "tandem $tandem ($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')); $(nproc) cores; $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
command -v nvidia-smi >/dev/null && log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"

srv_pid=""
stop_server() {
  [ -n "$srv_pid" ] || return 0
  kill -TERM "$srv_pid" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$srv_pid" 2>/dev/null && { log "the server did not exit in 30 s after SIGTERM: killed"; kill -KILL "$srv_pid"; }
  wait "$srv_pid" 2>/dev/null
  srv_pid=""
}
trap stop_server EXIT

# run_config LABEL NPROMPTS SERVE_ARGS...
failed=0
run_config() {
  local label=$1 n=$2
  shift 2
  local slog="$out/$label.server.log"
  log "$label: $tandem serve $* --port 0 --max-batch 32 --max-queue 0"
  "$tandem" serve "$@" --host 127.0.0.1 --port 0 --max-batch 32 --max-queue 0 </dev/null >/dev/null 2>"$slog" &
  srv_pid=$!
  local port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\).*/\1/p' "$slog" | head -n 1)
    [ -n "$port" ] && break
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    log "$label: the server did not start: $(tail -n 3 "$slog" | tr '\n' ' ')"
    stop_server; failed=1; return
  fi
  # (--wait-health: the models load after the server listens; the 7B file takes a while)
  local cmd=(python3 "$here/bench/serve_bench.py" --port "$port" --wait-health 600 --prompts "$prompts"
             --num-prompts "$n" --max-tokens "$ntok" --concurrency "$conc" --label "$label" --json "$out/$label.json")
  # shellcheck disable=SC2206
  cmd+=($bench_args)
  log "$label: ${cmd[*]}"
  if "${cmd[@]}" >"$out/$label.txt"; then
    log "$label: done ($(grep -E '^(P50 TPOT|Output token throughput)' "$out/$label.txt" | tr -s ' ' | paste -sd ';' -))"
  else
    log "$label: serve_bench failed (exit $?; $label.txt, $label.server.log)"; failed=1
  fi
  kill -0 "$srv_pid" 2>/dev/null || { log "$label: the server died: $(tail -n 3 "$slog" | tr '\n' ' ')"; failed=1; }
  stop_server
}

t0=$(date +%s)
target=$models/pycode-target-f16.gguf draft=$models/pycode-draft-xs-f16.gguf
for b in ${backends//,/ }; do
  extra=(--backend "$b")
  [ "$b" = cpu ] && extra+=(-t "$threads")
  if in_list pycode-spec "$configs"; then run_config "pycode-spec-$b" "$nprompts" -m "$target" -d "$draft" "${extra[@]}"; fi
  if in_list pycode-plain "$configs"; then run_config "pycode-plain-$b" "$nprompts" -m "$target" "${extra[@]}"; fi
  if in_list llama2-7b "$configs"; then
    if [ "$b" != cuda ] && [ "$llama_shape" = llama2-7b ]; then
      log "llama2-7b: cuda only (--llama-shape llama-160m tries the path on the CPU)"
      continue
    fi
    if [ ! -f "$llama" ]; then
      mkdir -p "$(dirname "$llama")"
      log "synth --shape $llama_shape --type f16 $llama"
      "$tandem" synth --shape "$llama_shape" --type f16 "$llama" >"$out/synth.log" 2>&1 ||
        { log "synth failed (synth.log)"; failed=1; continue; }
    fi
    run_config "$llama_shape-$b" "$llama_nprompts" -m "$llama" "${extra[@]}"
  fi
done
"${PLOT_PYTHON:-python3}" "$here/bench/serve_plot.py" --png "$out/serve-latency.png" "$out"/*.json >"$out/summary.md" 2>>"$out/run.log" ||
  log "serve_plot failed"
cat "$out/summary.md"
log "done in $(($(date +%s) - t0)) s: $out"
exit $failed
