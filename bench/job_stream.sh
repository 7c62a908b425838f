#!/usr/bin/env bash
# job_stream.sh - `tandem run` fed continuously vs another build's runner (the
# windowed one of older mains), same job, alternated A B A B...: a job of N pycode
# prompts (tests/data/prompts-dev.jsonl, repeated) with mixed max_tokens (16..512,
# a fixed pseudo-random draw per line), the rest as CFG says (default
# configs/pycode-cpu.ini).
#
# usage: [CFG=configs/pycode-gpu.ini] bench/job_stream.sh OLD_TANDEM NEW_TANDEM [N=200] [ROUNDS=2]
# prints each run's wall time and the medians.
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
A="$1" B="$2" N="${3:-200}" R="${4:-2}" CFG="${CFG:-$HERE/configs/pycode-cpu.ini}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
python3 - "$HERE/tests/data/prompts-dev.jsonl" "$N" >"$W/in.jsonl" <<'PY'
import json, random, sys
src = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rng = random.Random(43)
for i in range(int(sys.argv[2])):
    p = dict(src[i % len(src)]); p["id"] = i
    p["max_tokens"] = rng.choice([16, 32, 64, 128, 256, 512])
    print(json.dumps(p))
PY
one() { # BIN LABEL ROUND
    rm -f "$W/out.jsonl"
    local t0 t1
    t0=$(date +%s.%N)
    "$1" run "$CFG" --set job.input="$W/in.jsonl" --set job.output="$W/out.jsonl" 2>"$W/err" >/dev/null || { echo "$2: failed: $(tail -n 2 "$W/err")" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$2 $(python3 -c "print(round($t1 - $t0, 3))") $(wc -l <"$W/out.jsonl") lines; $(tail -n 1 "$W/err" | cut -c1-90)"
}
for r in $(seq "$R"); do
    one "$A" old "$r"
    one "$B" new "$r"
done | tee "$W/times"
python3 - "$W/times" <<'PY'
import statistics, sys
t = {}
for l in open(sys.argv[1]):
    k, s = l.split()[:2]; t.setdefault(k, []).append(float(s))
o, n = statistics.median(t["old"]), statistics.median(t["new"])
print("median old %.2f s, new %.2f s: %.2fx" % (o, n, o / n))
PY
