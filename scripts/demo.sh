#!/usr/bin/env bash
# Sets up, builds, and runs a speculative completion of a prompt from tests/data
# with the shipped target and draft models, printing the text and its speed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
prompt=$(python3 -c 'import json,sys; print(json.loads(open("tests/data/prompts-dev.jsonl").readline())["prompt"], end="")')
exec ./build/tandem generate -m models/pycode-target-f16.gguf -d models/pycode-draft-s-f16.gguf \
  -p "$prompt" -n 128 --threads 2 "$@"
