#!/usr/bin/env bash
# Sets up, builds, and runs the main job (configs/pycode-cpu.ini: the 100 prompts of
# tests/data/prompts-dev.jsonl through the shipped pycode target and draft, greedy,
# speculative) into a fresh output file, then prints the first completion.  Extra
# arguments go to `tandem run` (e.g. --set engine.threads=2).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
out=$(mktemp --suffix=.jsonl)
rm -f "$out" # (a job resumes an existing output: start from none)
./build/tandem run configs/pycode-cpu.ini --set "job.output=$out" "$@"
python3 - "$out" <<'PY'
import json, sys
first = json.loads(open(sys.argv[1]).readline())
print("\nfirst completion (id %s):\n%s" % (first.get("id"), first.get("text", "")))
print("\nall 100 in %s" % sys.argv[1])
PY
