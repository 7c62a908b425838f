#!/usr/bin/env bash
# test_cli.sh - end-to-end checks of the `tandem` command line.
#
# usage: tests/test_cli.sh path/to/tandem
# Uses $TDM_MODELS and $TDM_TEST_DATA when set (meson sets both), else the
# models/ and tests/data/ directories next to this script.  Needs python3.
# Exit status 0 when every check passes, 1 otherwise.
. "$(dirname "$0")/cli_testlib.sh"

# ------------------------------------------------------------ help, version
"$TANDEM" --help >"$TMP/out" 2>"$TMP/err"
if [ $? -eq 0 ] && grep -q '^usage: tandem' "$TMP/out" && [ ! -s "$TMP/err" ]; then
    pass "--help prints usage on stdout, exit 0"
else
    fail "--help"
fi
# the command list: every command, one line each, and no command's options
"$TANDEM" help >"$TMP/out" 2>&1 || fail "help: exit status"
for c in generate chat tokenize info bench synth run merge quantize serve help; do
    grep -Eq "^  $c +[a-z]" "$TMP/out" || fail "help: command $c missing from the list"
done
if [ "$(wc -l <"$TMP/out")" -le 25 ] && ! grep -q -- '--max-tokens' "$TMP/out"; then
    pass "help: the command list only ($(wc -l <"$TMP/out") lines)"
else
    fail "help: more than the command list ($(wc -l <"$TMP/out") lines)"
fi
"$TANDEM" --help | cmp -s - "$TMP/out" && pass "--help = help" || fail "--help differs from help"
# per-command help: that command's options, not the others'
"$TANDEM" generate --help >"$TMP/out" 2>"$TMP/err"
if [ $? -eq 0 ] && head -n 1 "$TMP/out" | grep -q '^usage: tandem generate ' && grep -q -- '--temp T' "$TMP/out" &&
    ! grep -q -- '--api-key' "$TMP/out" && ! grep -q 'tandem quantize' "$TMP/out" && [ ! -s "$TMP/err" ]; then
    pass "generate --help: generate's options only"
else
    fail "generate --help ($(head -n 2 "$TMP/out"))"
fi
"$TANDEM" serve --help >"$TMP/out" 2>&1
if head -n 1 "$TMP/out" | grep -q '^usage: tandem serve ' && grep -q -- '--api-key' "$TMP/out" &&
    ! grep -q -- '--spec-oracle' "$TMP/out"; then
    pass "serve --help: serve's options only"
else
    fail "serve --help ($(head -n 2 "$TMP/out"))"
fi
"$TANDEM" help quantize | head -n 1 | grep -q '^usage: tandem quantize ' && pass "help quantize" ||
    fail "help quantize"
"$TANDEM" chat --help >"$TMP/out" 2>&1
head -n 1 "$TMP/out" | grep -q '^usage: tandem chat ' && grep -q -- '--temp T' "$TMP/out" &&
    pass "chat --help: chat's usage and generate's options" || fail "chat --help"
for c in tokenize info bench synth run merge; do
    "$TANDEM" $c --help >"$TMP/out" 2>&1 && head -n 1 "$TMP/out" | grep -q "^usage: tandem $c " &&
        pass "$c --help" || fail "$c --help ($(head -n 1 "$TMP/out"))"
done
# a usage error: the error and one line pointing to the command's help
expect_exit 2 "generate --temperature" "$TANDEM" generate -m "$TARGET" -p x --temperature 0.5
expect_err "unknown option '--temperature' (did you mean --temp?)" "generate --temperature"
if [ "$(wc -l <"$TMP/err")" -eq 2 ] && grep -qx "see 'tandem generate --help' for generate's options" "$TMP/err"; then
    pass "generate --temperature: two lines, the error and the pointer"
else
    fail "generate --temperature: stderr is $(wc -l <"$TMP/err") lines"
fi
expect_exit 2 "genrate" "$TANDEM" genrate -m "$TARGET"
expect_err "unknown command 'genrate' (did you mean generate?)" "genrate"
expect_err "see 'tandem --help' for the commands" "genrate"
expect_exit 2 "serve --max-conection" "$TANDEM" serve --max-conection 3
expect_err "(did you mean --max-connections?)" "serve --max-conection"
expect_exit 2 "chat --top_p (generate's option)" "$TANDEM" chat -m "$TARGET" --top_p 0.5
expect_err "(did you mean --top-p?)" "chat --top_p"
expect_exit 2 "run --shrd" "$TANDEM" run job.ini --shrd 0/2
expect_err "(did you mean --shard?)" "run --shrd"
expect_exit 2 "generate --bogus: no suggestion" "$TANDEM" generate -m "$TARGET" -p x --bogus
grep -q 'did you mean' "$TMP/err" && fail "--bogus: a far-fetched suggestion ($(head -n 1 "$TMP/err"))" ||
    pass "--bogus: no suggestion"
expect_exit 2 "generate -x: no guess at one-letter options" "$TANDEM" generate -m "$TARGET" -p x -x
grep -q 'did you mean' "$TMP/err" && fail "-x: a guess ($(head -n 1 "$TMP/err"))" || pass "-x: no suggestion"
expect_exit 2 "help nosuch" "$TANDEM" help nosuch
# --version: the version and the build's backends, one line each
"$TANDEM" --version >"$TMP/out" 2>&1
if head -n 1 "$TMP/out" | grep -Eq '^tandem [0-9]+\.[0-9]+\.[0-9]+ \(library [0-9]+\.[0-9]+\.[0-9]+\)$' &&
    grep -Eq '^cpu: SIMD levels built: scalar.*; this CPU: (scalar|avx2|avx512)$' "$TMP/out" &&
    grep -Eq '^cuda: (built|not built)' "$TMP/out" && grep -Eq '^nccl: (built|not built)' "$TMP/out" &&
    grep -Eq '^http server: (built|not built)' "$TMP/out"; then
    pass "--version: version, cpu, cuda, nccl, http server"
else
    fail "--version ($(cat "$TMP/out"))"
fi

# -------------------------------------------------------- bad command lines: 2
expect_exit 2 "no command" "$TANDEM"
expect_exit 2 "unknown command" "$TANDEM" frobnicate
expect_exit 2 "generate: unknown flag" "$TANDEM" generate -m "$TARGET" -p x --bogus
expect_exit 2 "generate: missing value" "$TANDEM" generate -m "$TARGET" -p x -n
expect_exit 2 "generate: bad number -n 12x" "$TANDEM" generate -m "$TARGET" -p x -n 12x
expect_exit 2 "generate: bad number -n ''" "$TANDEM" generate -m "$TARGET" -p x -n ''
expect_exit 2 "generate: negative -n" "$TANDEM" generate -m "$TARGET" -p x -n -3
expect_exit 2 "generate: -n overflow" "$TANDEM" generate -m "$TARGET" -p x -n 99999999999999999999
expect_exit 2 "generate: --gpu-mem 12Q" "$TANDEM" generate -m "$TARGET" -p x --gpu-mem 12Q
expect_err "'12Q' is not a size" "generate: --gpu-mem 12Q"
expect_exit 2 "bench: --gpu-mem below 1M" "$TANDEM" bench -m "$TARGET" --gpu-mem 512K
expect_exit 2 "bench: --gpu-mem overflow" "$TANDEM" bench -m "$TARGET" --gpu-mem 99999999999T
expect_exit 2 "generate: bad --temp" "$TANDEM" generate -m "$TARGET" -p x --temp 0.5.1
expect_exit 2 "generate: --temp nan" "$TANDEM" generate -m "$TARGET" -p x --temp nan
expect_exit 2 "generate: --top-p out of range" "$TANDEM" generate -m "$TARGET" -p x --top-p 1.5
expect_exit 2 "generate: bad --seed" "$TANDEM" generate -m "$TARGET" -p x --seed -1
expect_exit 2 "generate: --spec-k 0" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-k 0
expect_exit 2 "generate: --spec-k 33" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-k 33
expect_exit 2 "generate: --spec-ngram 1" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-ngram 1
expect_exit 2 "generate: --spec-ngram 9" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-ngram 9
expect_exit 2 "bench: --spec-ngram x" "$TANDEM" bench -m "$TARGET" -d "$DRAFT" --spec-ngram x
for v in 0x 65 -2 "4,0" "4,,2"; do
    expect_exit 2 "generate: --spec-tree $v" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-tree "$v"
    expect_err "option --spec-tree: " "generate: --spec-tree $v"
done
expect_exit 2 "bench: --spec-tree many" "$TANDEM" bench -m "$TARGET" -d "$DRAFT" --spec-tree many
expect_exit 2 "generate: bad --backend" "$TANDEM" generate -m "$TARGET" -p x --backend tpu
expect_exit 2 "generate: missing -m" "$TANDEM" generate -p x
expect_exit 2 "generate: no prompt" "$TANDEM" generate -m "$TARGET"
expect_exit 2 "generate: both -p and --prompts" \
    "$TANDEM" generate -m "$TARGET" -p x --prompts "$DATA/prompts-dev.jsonl"
expect_exit 2 "generate: stray argument" "$TANDEM" generate -m "$TARGET" -p x extra
expect_exit 2 "tokenize: missing -m" "$TANDEM" tokenize --text x
expect_exit 2 "tokenize: unknown flag" "$TANDEM" tokenize -m "$TARGET" --bos
expect_exit 2 "info: no file" "$TANDEM" info
# the context and the KV budget: bad values are usage errors naming the option
for v in 0 -5 abc 16777217; do
    expect_exit 2 "generate: --ctx $v" "$TANDEM" generate -m "$TARGET" -p x --ctx "$v"
    expect_err "option --ctx: " "generate: --ctx $v"
done
expect_exit 2 "bench: --ctx 0" "$TANDEM" bench -m "$TARGET" --ctx 0
expect_exit 2 "serve: --ctx x" "$TANDEM" serve -m "$TARGET" --ctx x
expect_exit 2 "info: --ctx 0" "$TANDEM" info "$TARGET" --ctx 0
expect_exit 2 "generate: --kv-mem 100K" "$TANDEM" generate -m "$TARGET" -p x --kv-mem 100K
expect_err "option --kv-mem: " "generate: --kv-mem 100K"
expect_exit 2 "bench: missing -m" "$TANDEM" bench -p 16
expect_exit 2 "bench: bad --reps" "$TANDEM" bench -m "$TARGET" --reps 0
expect_exit 2 "bench: bad -p" "$TANDEM" bench -m "$TARGET" -p abc

# --------------------------------------------------- runtime errors: exit 1
head -c 100 /dev/urandom >"$TMP/garbage.gguf"
head -c 4096 "$TARGET" >"$TMP/truncated.gguf"
: >"$TMP/empty.gguf"
expect_exit 1 "generate: missing model file" "$TANDEM" generate -m "$TMP/nonexistent.gguf" -p x
expect_exit 1 "generate: garbage model file" "$TANDEM" generate -m "$TMP/garbage.gguf" -p x
expect_exit 1 "generate: truncated model file" "$TANDEM" generate -m "$TMP/truncated.gguf" -p x
expect_exit 1 "generate: empty model file" "$TANDEM" generate -m "$TMP/empty.gguf" -p x
expect_exit 1 "generate: missing draft file" "$TANDEM" generate -m "$TARGET" -d "$TMP/nope.gguf" -p x
expect_exit 1 "tokenize: missing model file" "$TANDEM" tokenize -m "$TMP/nonexistent.gguf" --text x
expect_exit 1 "tokenize: truncated model file" "$TANDEM" tokenize -m "$TMP/truncated.gguf" --text x
expect_exit 1 "info: missing file" "$TANDEM" info "$TMP/nonexistent.gguf"
expect_exit 1 "info: truncated file" "$TANDEM" info "$TMP/truncated.gguf"
expect_exit 1 "info: garbage file" "$TANDEM" info "$TMP/garbage.gguf"
one_line_err "info: garbage file"
expect_exit 1 "bench: missing model file" "$TANDEM" bench -m "$TMP/nonexistent.gguf"
expect_exit 1 "generate: missing prompts file" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/none.jsonl"

# A bad prompt line is reported with file and line before anything is generated.
check_bad_prompts() {
    local desc=$1 content=$2
    printf '%s' "$content" >"$TMP/bad.jsonl"
    expect_exit 1 "prompts: $desc" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/bad.jsonl" -n 2
    if ! grep -q 'bad.jsonl:3' "$TMP/err"; then
        fail "prompts: $desc: message does not name bad.jsonl:3 ($(head -c 200 "$TMP/err"))"
    fi
}
GOOD='{"id": 1, "prompt": "def f(x):"}'
check_bad_prompts "invalid JSON" "$GOOD"$'\n\n''{"id": 2, "prompt": "x"'$'\n'
check_bad_prompts "missing prompt" "$GOOD"$'\n\n''{"id": 2}'$'\n'
check_bad_prompts "prompt not a string" "$GOOD"$'\n\n''{"id": 2, "prompt": 7}'$'\n'
check_bad_prompts "bad id type" "$GOOD"$'\n\n''{"id": [2], "prompt": "x"}'$'\n'
check_bad_prompts "bad max_tokens" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "max_tokens": "9"}'$'\n'
check_bad_prompts "negative seed" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "seed": -4}'$'\n'
check_bad_prompts "bad temperature" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "temperature": null}'$'\n'
check_bad_prompts "not an object" "$GOOD"$'\n\n''"x"'$'\n'
# The scheduling members: a bad one is named.
check_bad_prompts "priority not an integer" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "priority": "x"}'$'\n'
expect_err '"priority" must be an integer' "prompts: priority \"x\""
check_bad_prompts "stop [1]" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "stop": [1]}'$'\n'
expect_err '"stop"[0] must be a string' "prompts: stop [1]"
check_bad_prompts "timeout_s -1" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "timeout_s": -1}'$'\n'
expect_err '"timeout_s" must be a number of seconds in [0, 1e+09]' "prompts: timeout_s -1"
check_bad_prompts "stop of 17 strings" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "stop": ["a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a"]}'$'\n'
expect_err '"stop" has 17 strings, more than 16' "prompts: 17 stop strings"
check_bad_prompts "stop of 257 bytes" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "stop": "'"$(printf 'x%.0s' $(seq 257))"'"}'$'\n'
expect_err '"stop" is longer than 256 bytes' "prompts: a stop string of 257 bytes"
check_bad_prompts "empty stop string" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "stop": ["a", ""]}'$'\n'
expect_err '"stop"[1] is empty' "prompts: an empty stop string"

# ------------------------------------------------- bad input (issue 23)
# Readers stop at their stated limits: a line of 1 MiB, an input of 64 MiB.
expect_exit 1 "prompts: /dev/zero" "$TANDEM" generate -m "$TARGET" --prompts /dev/zero
expect_err "/dev/zero:1: line longer than the 1 MiB limit" "prompts: /dev/zero"
head -c 1100000 /dev/zero | tr '\0' 'x' >"$TMP/nonl.jsonl"
expect_exit 1 "prompts: a long file without a newline" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/nonl.jsonl"
expect_err "nonl.jsonl:1: line longer than the 1 MiB limit" "prompts: no newline"
{ echo "$GOOD"; head -c 1048577 /dev/zero | tr '\0' ' '; echo; } >"$TMP/long2.jsonl"
expect_exit 1 "prompts: line 2 over the limit" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/long2.jsonl"
expect_err "long2.jsonl:2: line longer than the 1 MiB limit" "prompts: line 2"
truncate -s 65M "$TMP/huge.jsonl"
expect_exit 1 "prompts: a 65 MiB file" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/huge.jsonl"
expect_err "huge.jsonl: input larger than the 64 MiB limit" "prompts: 65 MiB file"
rm -f "$TMP/huge.jsonl"
expect_exit 1 "prompts: a directory" "$TANDEM" generate -m "$TARGET" --prompts "$TMP"
expect_err "is a directory" "prompts: a directory"
# a pipe is read as a stream, within the same limits
expect_exit 0 "prompts: from a pipe" "$TANDEM" generate -m "$TARGET" -n 1 --prompts <(echo "$GOOD")
line=$(head -c 100000 /dev/zero | tr '\0' ' ')
expect_exit 1 "prompts: a pipe of 65 MiB" "$TANDEM" generate -m "$TARGET" \
    --prompts <(yes "$line" | head -c 68000000)
expect_err "input larger than the 64 MiB limit" "prompts: 65 MiB pipe"
STDIN=/dev/zero expect_exit 1 "tokenize: stdin /dev/zero" "$TANDEM" tokenize -m "$TARGET"
expect_err "stdin: input larger than the 64 MiB limit" "tokenize: stdin /dev/zero"

# A numeric id must be one a double can hold (no infinity, no false 0) ...
check_bad_prompts "id 1e400" "$GOOD"$'\n\n''{"id": 1e400, "prompt": "x"}'$'\n'
expect_err '"id" 1e400 is outside the range of a double' "prompts: id 1e400"
check_bad_prompts "id -1e400" "$GOOD"$'\n\n''{"id": -1e400, "prompt": "x"}'$'\n'
check_bad_prompts "id 1e-400" "$GOOD"$'\n\n''{"id": 1e-400, "prompt": "x"}'$'\n'
# ... and comes back exactly as written.
printf '%s\n' '{"id": 9007199254740993, "prompt": "a"}' '{"id": 12345678901234567890123, "prompt": "b"}' \
    '{"id": 1.50, "prompt": "c"}' '{"id": -0, "prompt": "d"}' >"$TMP/ids.jsonl"
expect_exit 0 "prompts: big and fractional ids" "$TANDEM" generate -m "$TARGET" -n 1 --json --prompts "$TMP/ids.jsonl"
got=$(sed -n 's/^{"id": \([^,]*\),.*/\1/p' "$TMP/out" | tr '\n' ' ')
[ "$got" = "9007199254740993 12345678901234567890123 1.50 -0 " ] && pass "ids echoed verbatim" ||
    fail "ids echoed verbatim: got '$got'"
# A repeated member is an error naming it.
check_bad_prompts "duplicate key" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "id": 3}'$'\n'
expect_err 'duplicate member name "id"' "prompts: duplicate key"

# Seeds: the whole 64-bit range, exactly, in a file as with --seed.
seed_tokens() { # seed_tokens ARGS...: the tokens of sampled completions, one line each
    "$TANDEM" generate -m "$TARGET" -n 6 --temp 1.5 --json "$@" 2>&1 |
        sed -n 's/.*"tokens": \(\[[^]]*\]\).*/\1/p'
}
for s in 9007199254740993 9007199254740992 18446744073709551615; do
    printf '{"prompt": "def f(x):", "seed": %s}\n' "$s"
done >"$TMP/seeds.jsonl"
seed_tokens --prompts "$TMP/seeds.jsonl" >"$TMP/seeds.out"
for i in 1 3; do
    s=$(sed -n "${i}s/.*\"seed\": \([0-9]*\).*/\1/p" "$TMP/seeds.jsonl")
    a=$(sed -n "${i}p" "$TMP/seeds.out") b=$(seed_tokens -p "def f(x):" --seed "$s")
    [ -n "$a" ] && [ "$a" = "$b" ] && pass "seed $s: file = --seed" || fail "seed $s: file $a, --seed $b"
done
[ "$(sed -n 1p "$TMP/seeds.out")" != "$(sed -n 2p "$TMP/seeds.out")" ] &&
    pass "seeds 2^53 and 2^53 + 1 differ" || fail "seeds 2^53 and 2^53 + 1 give the same tokens"
check_bad_prompts "seed 2^64" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "seed": 18446744073709551616}'$'\n'
expect_exit 2 "generate: --seed 2^64" "$TANDEM" generate -m "$TARGET" -p x --seed 18446744073709551616

# A flag's stated range is the library's: outside it is a usage error.
expect_exit 2 "generate: --top-p 0" "$TANDEM" generate -m "$TARGET" -p x --top-p 0
expect_err "(0, 1]" "generate: --top-p 0"
expect_exit 2 "generate: --top-p 1e-50 (0 as a float)" "$TANDEM" generate -m "$TARGET" -p x --top-p 1e-50
expect_exit 2 "generate: --temp 1e39 (infinite as a float)" "$TANDEM" generate -m "$TARGET" -p x --temp 1e39
expect_exit 2 "generate: --min-p 1.5" "$TANDEM" generate -m "$TARGET" -p x --min-p 1.5
expect_exit 2 "generate: --p-min 1.5" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --p-min 1.5
expect_exit 2 "generate: --spec-k-max 33" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --spec-k-max 33
expect_exit 2 "generate: --top-k -1" "$TANDEM" generate -m "$TARGET" -p x --top-k -1
expect_exit 2 "generate: --threads 1025" "$TANDEM" generate -m "$TARGET" -p x --threads 1025
expect_err "[0, 1024]" "generate: --threads 1025"
expect_exit 2 "bench: --threads 4096" "$TANDEM" bench -m "$TARGET" --threads 4096
expect_exit 0 "generate: --top-p 1e-30 --temp 1 (the smallest kept)" \
    "$TANDEM" generate -m "$TARGET" -p x -n 1 --temp 1 --top-p 1e-30

# An option that takes effect only with another is refused without it.
for opt in "--spec-k 3" "--spec-k-max 4" "--p-min 0.5" "--spec-ngram 3" "--spec-ngram=off" "--spec-tree 8" \
    "--draft-vocab 2048"; do
    expect_exit 2 "generate: $opt without -d" "$TANDEM" generate -m "$TARGET" -p x $opt
    expect_err "option ${opt%%[ =]*} has no effect without -d DRAFT" "generate: $opt without -d"
done
expect_exit 2 "bench: --spec-k 3 without -d" "$TANDEM" bench -m "$TARGET" --spec-k 3
expect_exit 2 "bench: --limit without --prompts" "$TANDEM" bench -m "$TARGET" --limit 2
expect_err "option --limit has no effect without --prompts FILE" "bench: --limit without --prompts"

# No rate for work not done.
expect_exit 0 "generate -n 0" "$TANDEM" generate -m "$TARGET" -p "def f(x):" -n 0
expect_err "prefill 0.0 ms (n/a), decode 0.0 ms (n/a)" "generate -n 0"
expect_exit 0 "generate -n 1" "$TANDEM" generate -m "$TARGET" -p "def f(x):" -n 1
expect_err "decode 0.0 ms (n/a)" "generate -n 1"
expect_exit 0 "generate -n 0 --json" "$TANDEM" generate -m "$TARGET" -p "def f(x):" -n 0 --json
grep -qF '"timings": {"prefill_ms": 0.000, "decode_ms": 0.000, "decode_tok_per_s": 0.00}' "$TMP/out" &&
    pass "generate -n 0 --json: zero timings and rate" || fail "generate -n 0 --json: $(cat "$TMP/out")"
expect_exit 0 "bench -n 1" "$TANDEM" bench -m "$TARGET" -p 4 -n 1 --reps 1
grep -q '^decode: *n/a' "$TMP/out" && pass "bench -n 1: decode n/a" || fail "bench -n 1: $(cat "$TMP/out")"

# gguf_patch SRC DST TENSOR ACTION: DST = SRC with one change to TENSOR: ACTION "nan"
# sets its first element (an f32 tensor) to NaN, "type=N" rewrites its type number.
gguf_patch() {
    cp "$1" "$2" && python3 - "$2" "$3" "$4" <<'EOF'
import struct, sys
f = open(sys.argv[1], "r+b")
b = f.read(8 << 20)  # the header (metadata and tensor infos) is far smaller
pos = 4 + 4  # magic, version
def take(fmt):
    global pos
    v = struct.unpack_from("<" + fmt, b, pos)[0]
    pos += struct.calcsize("<" + fmt)
    return v
def string():
    global pos
    n = take("Q"); s = bytes(b[pos:pos + n]); pos += n
    return s
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def value(t):
    if t == 8: return string()
    if t == 9:
        et, n = take("I"), take("Q")
        return [value(et) for _ in range(n)]
    return take(SCALAR[t])
n_tensors, n_kv = take("Q"), take("Q")
align = 32
for _ in range(n_kv):
    k = string(); v = value(take("I"))
    if k == b"general.alignment": align = v
tensors = {}
for _ in range(n_tensors):
    name = string(); dims = [take("Q") for _ in range(take("I"))]
    tensors[name] = (pos, take("I"), take("Q"))
type_at, typ, off = tensors[sys.argv[2].encode()]
if sys.argv[3] == "nan":
    assert typ in (0, 1), "%s is not F32 or F16" % sys.argv[2]
    f.seek((pos + align - 1) // align * align + off)
    f.write(struct.pack("<f", float("nan")) if typ == 0 else struct.pack("<H", 0x7E00))
else:
    f.seek(type_at)
    f.write(struct.pack("<I", int(sys.argv[3].split("=")[1])))
EOF
}
# A model whose weights hold NaN: an error naming it, not token 0 and "eos".
nan_copy() { gguf_patch "$1" "$2" output_norm.weight nan; }
nan_copy "$TARGET" "$TMP/nan-target.gguf" && nan_copy "$DRAFT" "$TMP/nan-draft.gguf" ||
    fail "writing NaN copies of the models"
expect_exit 1 "generate: NaN target" "$TANDEM" generate -m "$TMP/nan-target.gguf" -p "def f(x):" -n 4 --json
expect_err "target model 'nan-target.gguf': non-finite logits" "generate: NaN target"
expect_exit 1 "generate: NaN target, sampling" "$TANDEM" generate -m "$TMP/nan-target.gguf" -p x -n 4 --temp 0.8
expect_err "target model 'nan-target.gguf': non-finite logits" "generate: NaN target, sampling"
expect_exit 1 "generate: NaN target with a draft" \
    "$TANDEM" generate -m "$TMP/nan-target.gguf" -d "$DRAFT" -p "def f(x):" -n 4 --json
expect_err "target model 'nan-target.gguf'" "generate: NaN target with a draft"
# a target/draft pair that does not go together: the error names both files
"$TANDEM" synth --shape tiny --type f16 "$TMP/tiny-spm.gguf" >/dev/null 2>&1 || fail "synth tiny for the mismatch case"
expect_exit 1 "generate: a draft of another vocabulary" "$TANDEM" generate -m "$TARGET" -d "$TMP/tiny-spm.gguf" -p x -n 2
expect_err "target '$TARGET' and draft '$TMP/tiny-spm.gguf' do not go together: target vocab size" \
    "generate: a draft of another vocabulary"
expect_exit 1 "bench: a draft of another vocabulary" "$TANDEM" bench -m "$TARGET" -d "$TMP/tiny-spm.gguf" -p 2 -n 2
expect_err "draft '$TMP/tiny-spm.gguf' do not go together" "bench: a draft of another vocabulary"
expect_exit 1 "generate: NaN draft" "$TANDEM" generate -m "$TARGET" -d "$TMP/nan-draft.gguf" -p "def f(x):" -n 8 --json
expect_err "draft model 'nan-draft.gguf': non-finite logits" "generate: NaN draft"

# ------------------------------------------------------------------- info
if "$TANDEM" info "$TARGET" >"$TMP/info" 2>"$TMP/err"; then
    if grep -q 'token_embd.weight' "$TMP/info" && grep -q 'general.architecture' "$TMP/info" &&
        grep -Eqi 'version' "$TMP/info"; then
        pass "info lists metadata and token_embd.weight"
    else
        fail "info output lacks token_embd.weight / general.architecture / version"
    fi
else
    fail "info $TARGET: exit $? ($(head -c 200 "$TMP/err"))"
fi
expect_exit 0 "info -m form" "$TANDEM" info -m "$DRAFT"
# the memory estimate: the target's f16 K/V are 2 x 8 layers x 2 kv heads x 64 x 2 bytes
# = 4 KiB a token, its context 1024 (smaller than the default 4096)
"$TANDEM" info "$TARGET" >"$TMP/out" 2>&1
if grep -q '^memory estimate (CPU' "$TMP/out" && grep -q '^  target weights: 30.0 MiB' "$TMP/out" &&
    grep -q '^  KV cache (f16): 4.0 KiB per token; 4.0 MiB at a context of 1024 (the default' "$TMP/out" &&
    grep -q '^  working buffers: ' "$TMP/out" && grep -q '^  total: ' "$TMP/out"; then
    pass "info: the memory estimate (weights, KV per token and at the default context, buffers)"
else
    fail "info: memory estimate: $(grep -A5 '^memory' "$TMP/out" | head -c 400)"
fi
"$TANDEM" info "$TARGET" -d "$DRAFT" --ctx 512 >"$TMP/out" 2>&1
if grep -q '^  draft weights: ' "$TMP/out" && grep -Eq '^  KV cache \(f16\): [0-9.]+ KiB per token \(both models\); [0-9.]+ MiB at a context of 512 \(--ctx\)' "$TMP/out"; then
    pass "info -d --ctx: the pair's estimate at the context given"
else
    fail "info -d --ctx: $(grep -A5 '^memory' "$TMP/out" | head -c 400)"
fi
"$TANDEM" info "$DATA/vocab/ggml-vocab-phi-3.gguf" >"$TMP/out" 2>&1
grep -q '^memory estimate: none (' "$TMP/out" && pass "info: no estimate for a vocabulary-only file" ||
    fail "info: vocabulary-only file: $(grep '^memory' "$TMP/out")"
grep -qx '  general.file_type: u32 = 1 (F16)' "$TMP/out" && pass "info: file type 1 named F16" ||
    fail "info: file type of an f16 model: $(grep file_type "$TMP/out")"
# general.file_type by llama.cpp's names; a chat template on its own lines
"$TANDEM" quantize "$MODELS/pycode-draft-xs-f16.gguf" "$TMP/q4km.gguf" --type q4_k_m >/dev/null 2>&1 &&
    "$TANDEM" info "$TMP/q4km.gguf" >"$TMP/out" 2>&1 &&
    grep -qx '  general.file_type: u32 = 15 (Q4_K - Medium)' "$TMP/out" &&
    pass "info: file type 15 named Q4_K - Medium" || fail "info: q4_k_m file type: $(grep file_type "$TMP/out")"
"$TANDEM" info "$DATA/vocab/ggml-vocab-phi-3.gguf" >"$TMP/out" 2>&1
if grep -qx '  tokenizer.chat_template: string = (269 bytes, 5 lines)' "$TMP/out" &&
    [ "$(grep -c '^    | ' "$TMP/out")" -eq 5 ] && grep -qx "    | '}}{% endif %}{% endfor %}" "$TMP/out"; then
    pass "info: the chat template on 5 lines"
else
    fail "info: chat template: $(grep -A2 chat_template "$TMP/out" | head -c 300)"
fi

# A file with tensors of types tandem does not compute with (an IQ4_NL tensor; issue
# 19 found it with Q4_1, supported since): info lists them, marked; tokenize needs no
# tensor; generate names the tensor and its type, once, on one line.
gguf_patch "$DRAFT" "$TMP/iq4_nl.gguf" blk.0.ffn_down.weight type=20 &&
    gguf_patch "$TMP/iq4_nl.gguf" "$TMP/unknown-type.gguf" blk.1.attn_q.weight type=99 ||
    fail "writing copies of the draft with unsupported tensor types"
for f in iq4_nl unknown-type; do
    expect_exit 0 "info: $f tensors" "$TANDEM" info "$TMP/$f.gguf"
    [ -s "$TMP/err" ] && fail "info: $f tensors: stderr not empty: $(head -c 200 "$TMP/err")"
    grep -Eq '^  blk\.0\.ffn_down\.weight +iq4_nl .* unsupported type 20 \(iq4_nl\)$' "$TMP/out" &&
        grep -Eq '^  blk\.0\.ffn_up\.weight +f16 +\[' "$TMP/out" && grep -q '^note: .* tensors\? ha' "$TMP/out" &&
        pass "info: $f tensors: the iq4_nl one marked unsupported" ||
        fail "info: $f tensors: $(grep -E 'ffn_down|^note' "$TMP/out" | head -3)"
    "$TANDEM" tokenize -m "$TMP/$f.gguf" --text "def f(x):" >"$TMP/out" 2>"$TMP/err" &&
        [ "$(cat "$TMP/out")" = "$("$TANDEM" tokenize -m "$DRAFT" --text "def f(x):")" ] &&
        pass "tokenize: $f tensors: the same ids as the original" ||
        fail "tokenize: $f tensors: $(head -c 200 "$TMP/out" "$TMP/err")"
done
"$TANDEM" info "$TMP/unknown-type.gguf" >"$TMP/out" 2>&1
grep -Eq '^  blk\.1\.attn_q\.weight +99 .* \? +unsupported type 99 \(not a GGML type\)$' "$TMP/out" &&
    grep -q '^note: 2 tensors have a type tandem does not support' "$TMP/out" &&
    pass "info: type 99: size unknown, marked" || fail "info: type 99: $(grep -E 'attn_q|^note' "$TMP/out")"
expect_exit 1 "generate: an iq4_nl tensor" "$TANDEM" generate -m "$TMP/iq4_nl.gguf" -p "def f(x):" -n 2
expect_err "tensor 'blk.0.ffn_down.weight' has type 20 (iq4_nl), which tandem does not support" "generate: an iq4_nl tensor"
one_line_err "generate: an iq4_nl tensor"
expect_exit 1 "generate: a type-99 tensor" "$TANDEM" generate -m "$TMP/unknown-type.gguf" -p x -n 2
expect_err "has type " "generate: a type-99 tensor"

# --------------------------------------------------------------- tokenize
# a vocabulary-only GGUF (no tensors) is enough to tokenize
vocab_out=$("$TANDEM" tokenize -m "$DATA/vocab/ggml-vocab-llama-spm.gguf" --no-bos --text "Hello world" 2>&1)
if [ "$vocab_out" = "[15043, 3186]" ]; then pass "tokenize with a vocabulary-only GGUF"; else fail "tokenize with a vocabulary-only GGUF: got '$vocab_out'"; fi

python3 - "$DATA/tokenizer-cases.jsonl" "$TMP/info" <<'EOF'
import json, os, re, subprocess, sys
tandem, target = os.environ["TANDEM"], os.environ["TARGET"]
cases = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
info = open(sys.argv[2], encoding="utf-8", errors="replace").read()
fails = 0
def report(ok, what):
    global fails
    print(("ok   - " if ok else "FAIL - ") + what)
    if not ok:
        fails += 1
def tok(args, stdin=None):
    r = subprocess.run([tandem, "tokenize", "-m", target] + args, input=stdin,
                       capture_output=True)
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    lines = r.stdout.decode().splitlines()
    if len(lines) != 1:
        return None, "expected one line, got %r" % r.stdout[:200]
    return json.loads(lines[0]), None
n_ok = 0
for c in cases:
    if "\0" in c["text"]:
        continue
    got, err = tok(["--no-bos", "--text", c["text"]])
    if got != c["ids"]:
        report(False, "tokenize --no-bos --text %r: got %s, want %s %s" % (c["text"], got, c["ids"], err or ""))
    else:
        n_ok += 1
report(n_ok > 0 and fails == 0, "tokenize --no-bos: %d cases match tokenizer-cases.jsonl" % n_ok)
# stdin gives the same ids as --text (a case with a newline in it).
c = next(c for c in cases if "\n" in c["text"] and len(c["text"]) > 2)
got, err = tok(["--no-bos"], c["text"].encode())
report(got == c["ids"], "tokenize from stdin %r" % c["text"])
# BOS: prepended without --no-bos when the model asks (metadata as shown by info).
m_bos = re.search(r"tokenizer\.ggml\.bos_token_id: \w+ = (\d+)", info)
m_add = re.search(r"tokenizer\.ggml\.add_bos_token: \w+ = (\w+)", info)
c = next(c for c in cases if c["ids"])
got, err = tok(["--text", c["text"]])
if m_bos and m_add and m_add.group(1) == "true":
    want = [int(m_bos.group(1))] + c["ids"]
else:
    want = c["ids"]
report(got == want, "tokenize with BOS %r: got %s want %s" % (c["text"], got, want))
got, err = tok(["--text", ""])
report(got == want[:len(want) - len(c["ids"])], "tokenize --text '' gives only BOS (or nothing)")
got, err = tok(["--no-bos", "--text", ""])
report(got == [], "tokenize --no-bos --text '' gives []")

sys.exit(1 if fails else 0)
EOF
[ $? -eq 0 ] && pass "tokenize checks" || fail "tokenize checks"

# ---------------------------------------------------------- generate --json
cat >"$TMP/prompts.jsonl" <<'EOF'
{"id": 7, "prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"}

{"id": "str-id \"q\"", "prompt": "import os\nimport sys\n\n\ndef main(", "max_tokens": 3}
{"id": 9, "prompt": "class Stack:\n    def __init__(self):\n", "temperature": 0.8, "seed": 42}
EOF
python3 - "$TMP" <<'EOF'
import json, os, subprocess, sys
tandem, target, draft = os.environ["TANDEM"], os.environ["TARGET"], os.environ["DRAFT"]
tmp = sys.argv[1]
fails = 0
def report(ok, what):
    global fails
    print(("ok   - " if ok else "FAIL - ") + what)
    if not ok:
        fails += 1
def run(args):
    r = subprocess.run([tandem, "generate"] + args, capture_output=True)
    return r.returncode, r.stdout.decode("utf-8", errors="replace"), r.stderr.decode(errors="replace")
def check_obj(o, n_max, spec, what):
    ok = True
    for k, t in [("id", (int, float, str)), ("text", str), ("tokens", list),
                 ("finish_reason", str), ("prompt_tokens", int), ("timings", dict)]:
        if not isinstance(o.get(k), t):
            report(False, "%s: field %s missing or of wrong type: %r" % (what, k, o.get(k)))
            return False
    for k in ["prefill_ms", "decode_ms", "decode_tok_per_s"]:
        v = o["timings"].get(k)
        if not isinstance(v, (int, float)) or v < 0:
            report(False, "%s: timings.%s = %r" % (what, k, v)); ok = False
    if not all(isinstance(t, int) and t >= 0 for t in o["tokens"]):
        report(False, "%s: tokens not non-negative ints" % what); ok = False
    if o["finish_reason"] not in ("eos", "length"):
        report(False, "%s: finish_reason %r" % (what, o["finish_reason"])); ok = False
    if len(o["tokens"]) > n_max or (o["finish_reason"] == "length" and len(o["tokens"]) != n_max):
        report(False, "%s: %d tokens with max %d and finish %s" % (what, len(o["tokens"]), n_max, o["finish_reason"])); ok = False
    if o["prompt_tokens"] <= 0:
        report(False, "%s: prompt_tokens %r" % (what, o["prompt_tokens"])); ok = False
    if spec:
        s = o.get("spec")
        if not isinstance(s, dict):
            report(False, "%s: spec missing" % what); return False
        for k in ["steps", "drafted", "accepted", "acceptance_rate", "mean_accepted", "k_final"]:
            if not isinstance(s.get(k), (int, float)) or s[k] < 0:
                report(False, "%s: spec.%s = %r" % (what, k, s.get(k))); ok = False
        if ok and (s["accepted"] > s["drafted"] or s["acceptance_rate"] > 1.0 + 1e-9):
            report(False, "%s: spec accepted %r > drafted %r" % (what, s["accepted"], s["drafted"])); ok = False
    elif "spec" in o:
        report(False, "%s: spec present without a draft" % what); ok = False
    return ok

# -p with --json: one object, id 0, nothing but JSON on stdout.
rc, out, err = run(["-m", target, "-p", "def add(a, b):\n", "-n", "8", "--json"])
lines = out.splitlines()
try:
    objs = [json.loads(l) for l in lines]
except ValueError as e:
    objs = None
report(rc == 0 and objs is not None and len(objs) == 1, "generate -p --json: exit 0, one JSON line (rc=%d, %s)" % (rc, err[:200]))
if objs and len(objs) == 1:
    report(check_obj(objs[0], 8, False, "generate -p --json") and objs[0]["id"] == 0, "generate -p --json fields, id 0")
    single = objs[0]
    # Without --json the same greedy completion streams to stdout (+ newline) and speed goes to stderr.
    rc2, out2, err2 = run(["-m", target, "-p", "def add(a, b):\n", "-n", "8"])
    report(rc2 == 0 and out2 == single["text"] + "\n", "generate text output equals the --json text (%r vs %r)" % (out2, single["text"]))
    report("[id 0]" in err2 and "tok/s" in err2 and "prefill" in err2, "generate speed line on stderr: %r" % err2.strip()[:200])

# prompts file with a draft: ids echoed, per-prompt max_tokens honoured.
rc, out, err = run(["-m", target, "-d", draft, "--prompts", os.path.join(tmp, "prompts.jsonl"), "-n", "12", "--json"])
try:
    objs = [json.loads(l) for l in out.splitlines()]
except ValueError:
    objs = None
report(rc == 0 and objs is not None and len(objs) == 3, "generate --prompts -d --json: 3 JSON lines (rc=%d, %s)" % (rc, err[:200]))
if objs and len(objs) == 3:
    report([o["id"] for o in objs] == [7, 'str-id "q"', 9], "ids echoed as given: %r" % [o["id"] for o in objs])
    report(all(check_obj(o, n, True, "prompt %r" % o["id"]) for o, n in zip(objs, [12, 3, 12])),
           "generate --prompts -d --json fields (spec included, max_tokens override)")

# Fixed speculation length.
rc, out, err = run(["-m", target, "-d", draft, "-p", "for i in range(10):\n", "-n", "10", "--spec-k", "3", "--json"])
try:
    o = json.loads(out)
    # A fixed k drafts at most k tokens a step (the last steps may draft fewer: the
    # engine never drafts past max_tokens).
    ok = rc == 0 and check_obj(o, 10, True, "--spec-k 3")
    ok = ok and 1 <= o["spec"]["k_final"] <= 3 and o["spec"]["steps"] > 0 and \
        o["spec"]["drafted"] <= 3 * o["spec"]["steps"]
    report(ok, "generate --spec-k 3: at most 3 drafted per step (%r)" % o.get("spec"))
except ValueError:
    report(False, "generate --spec-k 3: output is not JSON (rc=%d, %s)" % (rc, err[:200]))
# n-gram lookup: a repetitive prompt gets n-gram proposals, reported in spec.
rep = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"
rc, out, err = run(["-m", target, "-d", draft, "-p", rep, "-n", "24", "--spec-ngram", "3", "--json"])
try:
    o = json.loads(out)
    s = o.get("spec", {})
    ok = rc == 0 and check_obj(o, 24, True, "--spec-ngram 3")
    ok = ok and 0 < s.get("ngram_steps", 0) <= s["steps"] and s["ngram_accepted"] <= s["ngram_drafted"] <= s["drafted"]
    report(ok, "generate --spec-ngram 3: n-gram steps reported (%r)" % s)
except ValueError:
    report(False, "generate --spec-ngram 3: output is not JSON (rc=%d, %s)" % (rc, err[:200]))
# Token trees: every step a tree of at most the budget; forwards and tokens per
# forward reported (for chains too).  n-gram lookups off: whether a step is a lookup
# alone, verified as a chain, follows measured step costs (a loaded machine, a
# sanitizer build) and not the budget.
for tree, most in (("12", 12), ("3,2,1", 15)):
    rc, out, err = run(["-m", target, "-d", draft, "-p", "def f(x):\n", "-n", "24", "--spec-tree", tree,
                        "--spec-ngram", "0", "--json"])
    try:
        o = json.loads(out)
        s = o.get("spec", {})
        ok = rc == 0 and check_obj(o, 24, True, "--spec-tree " + tree)
        ok = ok and s["tree_steps"] == s["steps"] > 0 and s["tree_nodes"] <= most * s["steps"]
        ok = ok and s["forwards"] > 0 and abs(s["tokens_per_forward"] - 23.0 / s["forwards"]) < 1e-3
        report(ok, "generate --spec-tree %s: trees of at most %d nodes, tokens per forward (%r)" % (tree, most, s))
    except ValueError:
        report(False, "generate --spec-tree %s: output is not JSON (rc=%d, %s)" % (tree, rc, err[:200]))
rc, out, err = run(["-m", target, "-d", draft, "-p", "def f(x):\n", "-n", "24", "--spec-tree", "off", "--json"])
try:
    s = json.loads(out).get("spec", {})
    report(rc == 0 and s["tree_steps"] == 0 and s["forwards"] > 0 and s["tokens_per_forward"] >= 1,
           "generate --spec-tree off: chains, forwards reported (%r)" % s)
except ValueError:
    report(False, "generate --spec-tree off: output is not JSON (rc=%d, %s)" % (rc, err[:200]))
sys.exit(1 if fails else 0)
EOF
[ $? -eq 0 ] && pass "generate checks" || fail "generate checks"

# ------------------------------------------------------------------- bench
python3 - <<'EOF'
import json, os, subprocess, sys
tandem, target, draft = os.environ["TANDEM"], os.environ["TARGET"], os.environ["DRAFT"]
r = subprocess.run([tandem, "bench", "-m", target, "-d", draft, "-p", "32", "-n", "8",
                    "--reps", "2", "--json"], capture_output=True)
ok = r.returncode == 0
try:
    o = json.loads(r.stdout)
except ValueError:
    o, ok = {}, False
need = {"model": str, "threads": int, "prompt_tokens": int, "new_tokens": int,
        "prefill_tok_s": (int, float), "decode_tok_s": (int, float), "peak_rss_mb": (int, float),
        "reps": int, "spec": dict, "draft": str}
for k, t in need.items():
    if not isinstance(o.get(k), t):
        print("FAIL - bench field %s = %r" % (k, o.get(k)))
        ok = False
if ok and not (o["prompt_tokens"] == 32 and o["new_tokens"] == 8 and o["reps"] == 2 and
               o["prefill_tok_s"] > 0 and o["decode_tok_s"] > 0 and o["peak_rss_mb"] > 0):
    print("FAIL - bench values: %r" % o)
    ok = False
print(("ok   - " if ok else "FAIL - ") + "bench --json (rc=%d %s)" % (r.returncode, r.stderr[:200]))
sys.exit(0 if ok else 1)
EOF
[ $? -eq 0 ] && pass "bench checks" || fail "bench checks"

# ------------------------------------------------------------------- synth
# Random-weight models with real shapes.  "tiny" (n_embd 256, 2 layers, vocab
# 32000) keeps this fast; llama-160m f16 (~325 MB, under a second) is the one
# full-size write.
SPM=$DATA/vocab/ggml-vocab-llama-spm.gguf
expect_exit 2 "synth: missing --shape" "$TANDEM" synth --type f16 "$TMP/s.gguf"
expect_exit 2 "synth: unknown shape" "$TANDEM" synth --shape llama9-1t --type f16 "$TMP/s.gguf"
grep -q "llama9-1t" "$TMP/err" && grep -q "llama2-7b" "$TMP/err" || fail "synth: unknown shape message lists the shapes"
expect_exit 2 "synth: missing --type" "$TANDEM" synth --shape tiny "$TMP/s.gguf"
expect_exit 2 "synth: unknown type" "$TANDEM" synth --shape tiny --type q5_1 "$TMP/s.gguf"
expect_exit 2 "synth: missing OUT" "$TANDEM" synth --shape tiny --type f16
expect_exit 2 "synth: two outputs" "$TANDEM" synth --shape tiny --type f16 "$TMP/a.gguf" "$TMP/b.gguf"
expect_exit 2 "synth: bad --seed" "$TANDEM" synth --shape tiny --type f16 --seed x "$TMP/s.gguf"
expect_exit 2 "synth: unknown flag" "$TANDEM" synth --shape tiny --type f16 --bogus "$TMP/s.gguf"
expect_exit 2 "synth: --shape without a value" "$TANDEM" synth --type f16 "$TMP/s.gguf" --shape
expect_exit 1 "synth: unwritable path" "$TANDEM" synth --shape tiny --type f16 "$TMP/no/such/dir/s.gguf"
grep -q "no/such/dir/s.gguf" "$TMP/err" && grep -q "No such file or directory" "$TMP/err" ||
    fail "synth: unwritable path message names the path and the OS error ($(head -c 200 "$TMP/err"))"
expect_exit 1 "synth: missing tokenizer file" \
    "$TANDEM" synth --shape tiny --type f16 --tokenizer-from "$TMP/none.gguf" "$TMP/s.gguf"
expect_exit 1 "synth: tokenizer file not a GGUF" \
    "$TANDEM" synth --shape tiny --type f16 --tokenizer-from "$TMP/garbage.gguf" "$TMP/s.gguf"
expect_exit 1 "synth: tokenizer size mismatch" \
    "$TANDEM" synth --shape llama3-8b --type q4_0 --tokenizer-from "$SPM" "$TMP/s.gguf"
grep -q "32000" "$TMP/err" && grep -q "128256" "$TMP/err" ||
    fail "synth: mismatch message names both sizes ($(head -c 200 "$TMP/err"))"
[ ! -e "$TMP/s.gguf" ] && [ ! -e "$TMP/s.gguf.tmp" ] && pass "synth: failed runs leave no file" ||
    fail "synth: a failed run left $TMP/s.gguf or its .tmp"

# info of a synthetic model: "tensors: N", then one line per tensor: name type shape bytes
check_synth_info() { # FILE TYPE N_TENSORS N_MATRICES DESC
    local f=$1 ty=$2 nt=$3 nm=$4 desc=$5
    if ! "$TANDEM" info "$f" >"$TMP/sinfo" 2>"$TMP/err"; then
        fail "$desc: info failed ($(head -c 200 "$TMP/err"))"
        return
    fi
    local got_nt got_nm got_f32
    got_nt=$(sed -n 's/^tensors: //p' "$TMP/sinfo")
    got_nm=$(awk -v t="$ty" '$2 == t && $1 ~ /weight$/' "$TMP/sinfo" | wc -l)
    got_f32=$(awk '$2 == "f32" && $1 ~ /norm.weight$/' "$TMP/sinfo" | wc -l)
    if [ "$got_nt" = "$nt" ] && [ "$got_nm" -eq "$nm" ] && [ "$got_f32" -eq $((nt - nm)) ] &&
        grep -q 'general.architecture: string = "llama"' "$TMP/sinfo" &&
        grep -q '^  output.weight ' "$TMP/sinfo"; then
        pass "$desc: info lists $nt tensors, $nm of them $ty, the norms f32"
    else
        fail "$desc: info: tensors '$got_nt' (want $nt), $ty matrices $got_nm (want $nm), f32 norms $got_f32"
    fi
}
declare -A FILE_TYPE=([f16]=1 [q8_0]=7 [q4_0]=2)
for ty in f16 q8_0 q4_0; do
    out=$TMP/tiny-$ty.gguf
    expect_exit 0 "synth tiny $ty" "$TANDEM" synth --shape tiny --type "$ty" "$out"
    grep -q "^wrote $out: tiny $ty, 21 tensors, .* bytes .* in .* s" "$TMP/out" ||
        fail "synth tiny $ty: summary line ($(head -c 200 "$TMP/out"))"
    check_synth_info "$out" "$ty" 21 16 "synth tiny $ty"
    grep -q "general.file_type: u32 = ${FILE_TYPE[$ty]} (.*" "$TMP/sinfo" ||
        fail "synth tiny $ty: general.file_type is not ${FILE_TYPE[$ty]}"
    size=$(stat -c %s "$out")
    "$TANDEM" synth --shape tiny --type "$ty" --dry-run >"$TMP/dry" 2>&1
    grep -q " $size bytes" "$TMP/dry" && pass "synth tiny $ty: --dry-run size = file size ($size)" ||
        fail "synth tiny $ty: --dry-run says '$(cat "$TMP/dry")', the file has $size bytes"
    expect_exit 0 "generate with synth tiny $ty" "$TANDEM" generate -m "$out" -p "hello" -n 4
done
expect_exit 0 "bench with synth tiny q4_0" "$TANDEM" bench -m "$TMP/tiny-q4_0.gguf" -p 8 -n 4 --reps 1
# an EAGLE-3 head (the pycode target's shapes and tokenizer): info describes it, -d
# beside its target is checked and drafts (greedy: the target-only text)
expect_exit 0 "synth eagle3-pycode" "$TANDEM" synth --shape eagle3-pycode --type f16 --tokenizer-from "$TARGET" \
    "$TMP/e3.gguf"
expect_exit 0 "info of an EAGLE-3 head" "$TANDEM" info "$TMP/e3.gguf"
grep -q "^EAGLE-3 draft head" "$TMP/out" && grep -q "entering layers 2, 4, 5 (target hidden 384)" "$TMP/out" &&
    grep -q "draft vocabulary 2048 (d2t" "$TMP/out" && ! grep -q "unsupported type" "$TMP/out" &&
    pass "info describes the head" || fail "info of an EAGLE-3 head: $(grep -A5 EAGLE "$TMP/out")"
expect_exit 0 "info: target -d HEAD" "$TANDEM" info "$TARGET" -d "$TMP/e3.gguf"
grep -q "fits target" "$TMP/out" && pass "info: the pair checked" || fail "info: target -d HEAD: no fit line"
expect_exit 0 "generate -d HEAD" "$TANDEM" generate -m "$TARGET" -d "$TMP/e3.gguf" -p "def f" -n 16 --temp 0 \
    --spec-k 3
cp "$TMP/out" "$TMP/out-head"
expect_exit 0 "generate target-only" "$TANDEM" generate -m "$TARGET" -p "def f" -n 16 --temp 0
cmp -s "$TMP/out" "$TMP/out-head" && pass "generate -d HEAD: the target-only text" ||
    fail "generate -d HEAD: '$(head -c 200 "$TMP/out-head")', target-only '$(head -c 200 "$TMP/out")'"
expect_error "generate -d HEAD of another target" "does not fit target" \
    "$TANDEM" generate -m "$DRAFT" -d "$TMP/e3.gguf" -p "def f" -n 4
expect_error "a head as the model" "EAGLE-3 draft head" "$TANDEM" generate -m "$TMP/e3.gguf" -p "def f" -n 4
expect_exit 1 "synth: refuses to overwrite" "$TANDEM" synth --shape tiny --type q4_0 "$TMP/tiny-q4_0.gguf"
grep -q -- "--force" "$TMP/err" || fail "synth: the overwrite refusal mentions --force"
cp "$TMP/tiny-q4_0.gguf" "$TMP/tiny-q4_0-seed0.gguf"
expect_exit 0 "synth --force --seed 1" "$TANDEM" synth --shape tiny --type q4_0 --force --seed 1 "$TMP/tiny-q4_0.gguf"
"$TANDEM" synth --shape tiny --type q4_0 --seed 0 "$TMP/again.gguf" >/dev/null 2>&1
cmp -s "$TMP/again.gguf" "$TMP/tiny-q4_0-seed0.gguf" && ! cmp -s "$TMP/tiny-q4_0.gguf" "$TMP/again.gguf" &&
    pass "synth: the same seed gives the same file, another seed another" ||
    fail "synth: files are not deterministic in the seed"
rm -f "$TMP"/tiny-*.gguf "$TMP/again.gguf"

# the real Llama vocabulary: every tokenizer key copied, so it tokenizes like the vocab file
expect_exit 0 "synth --tokenizer-from llama-spm" \
    "$TANDEM" synth --shape tiny --type q8_0 --tokenizer-from "$SPM" "$TMP/tiny-spm.gguf"
"$TANDEM" info "$SPM" | grep '^  tokenizer\.' >"$TMP/tok-want"
"$TANDEM" info "$TMP/tiny-spm.gguf" | grep '^  tokenizer\.' >"$TMP/tok-got"
cmp -s "$TMP/tok-want" "$TMP/tok-got" && pass "synth --tokenizer-from copies every tokenizer key" ||
    fail "synth --tokenizer-from: tokenizer keys differ ($(diff "$TMP/tok-want" "$TMP/tok-got" | head -c 300))"
got=$("$TANDEM" tokenize -m "$TMP/tiny-spm.gguf" --no-bos --text "Hello world" 2>&1)
[ "$got" = "[15043, 3186]" ] && pass "synth --tokenizer-from: tokenizes with the Llama vocabulary" ||
    fail "synth --tokenizer-from: tokenize gave '$got'"
expect_exit 0 "generate with the llama-spm synth model" "$TANDEM" generate -m "$TMP/tiny-spm.gguf" -p "hello" -n 4
expect_exit 1 "synth: tokenizer of another size (gpt-2, 50257)" \
    "$TANDEM" synth --shape tiny --type q8_0 --tokenizer-from "$DATA/vocab/ggml-vocab-gpt-2.gguf" "$TMP/s.gguf"
rm -f "$TMP/tiny-spm.gguf"

# a real shape: llama-160m f16 (the 324 MB size is checked against the shape's arithmetic)
expect_exit 0 "synth llama-160m f16" "$TANDEM" synth --shape llama-160m --type f16 "$TMP/l160.gguf"
check_synth_info "$TMP/l160.gguf" f16 111 86 "synth llama-160m f16"
# 2 + 7 * 12 matrices (embedding and output [768, 32000], q k v o [768, 768], gate up
# [768, 3072], down [3072, 768]) and 1 + 2 * 12 norms [768]
mparams=$((2 * 768 * 32000 + 12 * (4 * 768 * 768 + 3 * 768 * 3072)))
params=$((mparams + 25 * 768))
grep -q "^total: 111 tensors, $params parameters, $((2 * mparams + 4 * 25 * 768)) bytes" "$TMP/sinfo" &&
    pass "synth llama-160m f16: $params parameters, all data accounted for" ||
    fail "synth llama-160m f16: totals: $(grep '^total' "$TMP/sinfo")"
rm -f "$TMP/l160.gguf"
"$TANDEM" synth --shape llama2-7b --type q4_0 --dry-run >"$TMP/dry" 2>&1
grep -q "^llama2-7b q4_0, 291 tensors, 6738415616 parameters" "$TMP/dry" &&
    pass "synth --dry-run llama2-7b q4_0: 291 tensors, 6738415616 parameters" ||
    fail "synth --dry-run llama2-7b: $(cat "$TMP/dry")"

# --batch: the same tokens, in input order, as one prompt at a time; a bad prompt
# fails alone (named by file:line, exit 1), the others still print
head -n 12 "$DATA/prompts-dev.jsonl" >"$TMP/p12.jsonl"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json 2>/dev/null | tokens >"$TMP/b1"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --batch 5 2>/dev/null | tokens >"$TMP/b5"
[ -s "$TMP/b1" ] && cmp -s "$TMP/b1" "$TMP/b5" && pass "generate --batch 5: the tokens of one at a time, in order" ||
    fail "generate --batch 5 differs: $(diff "$TMP/b1" "$TMP/b5" | head -c 300)"
long=$(yes 'def f(): pass' | head -n 1500 | tr '\n' ' ')
{ head -n 2 "$TMP/p12.jsonl"; echo "{\"id\": 99, \"prompt\": \"$long\"}"; sed -n 3p "$TMP/p12.jsonl"; } >"$TMP/pbad.jsonl"
"$TANDEM" generate -m "$TARGET" --prompts "$TMP/pbad.jsonl" -n 4 --json --batch 4 >"$TMP/out" 2>"$TMP/err"
[ $? -eq 1 ] && pass "generate --batch: a bad prompt exits 1" || fail "generate --batch: a bad prompt: exit not 1"
expect_err "pbad.jsonl:3: prompt of" "generate --batch: a prompt longer than the context"
[ "$(wc -l <"$TMP/out")" -eq 3 ] && pass "generate --batch: the other three prompts still print" ||
    fail "generate --batch: $(wc -l <"$TMP/out") result lines"
expect_exit 2 "generate --batch 0" "$TANDEM" generate -m "$TARGET" -p x --batch 0

# --kv-type: a q8_0 (an fp8) cache gives the same speculative tokens as target-only with
# a q8_0 (an fp8) cache; f16 on the CPU; chat and bench take it; bad values name the
# option and value
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type q8_0 2>/dev/null | tokens >"$TMP/q8s"
"$TANDEM" generate -m "$TARGET" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type=q8_0 2>/dev/null | tokens >"$TMP/q8t"
[ "$(wc -l <"$TMP/q8s")" -eq 12 ] && cmp -s "$TMP/q8s" "$TMP/q8t" &&
    pass "generate --kv-type q8_0: speculative tokens equal target-only tokens" ||
    fail "generate --kv-type q8_0: $(diff "$TMP/q8s" "$TMP/q8t" | head -c 300)"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type fp8 2>/dev/null | tokens >"$TMP/f8s"
"$TANDEM" generate -m "$TARGET" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type=fp8 2>/dev/null | tokens >"$TMP/f8t"
[ "$(wc -l <"$TMP/f8s")" -eq 12 ] && cmp -s "$TMP/f8s" "$TMP/f8t" &&
    pass "generate --kv-type fp8: speculative tokens equal target-only tokens" ||
    fail "generate --kv-type fp8: $(diff "$TMP/f8s" "$TMP/f8t" | head -c 300)"
expect_exit 0 "generate --kv-type f16" "$TANDEM" generate -m "$TARGET" -p "def f(x):" -n 4 --kv-type f16
expect_exit 0 "bench --kv-type q8_0" "$TANDEM" bench -m "$TARGET" -p 16 -n 4 --reps 1 --kv-type q8_0
printf 'def add(a, b):\n/exit\n' >"$TMP/kvchat.in"
STDIN="$TMP/kvchat.in" expect_exit 0 "chat --kv-type q8_0" "$TANDEM" chat -m "$TARGET" --chat-template chatml --kv-type q8_0 -n 4
# --draft-vocab: the draft's head over 1024 of the 8192 tokens gives target-only tokens
# (chains and trees); a bad value is refused, naming it
"$TANDEM" generate -m "$TARGET" --prompts "$TMP/p12.jsonl" -n 10 --json 2>/dev/null | tokens >"$TMP/dvt"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --draft-vocab 1024 2>/dev/null |
    tokens >"$TMP/dvs"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --draft-vocab=1024 --spec-tree 8 \
    2>/dev/null | tokens >"$TMP/dvtree"
[ "$(wc -l <"$TMP/dvt")" -eq 12 ] && cmp -s "$TMP/dvs" "$TMP/dvt" && cmp -s "$TMP/dvtree" "$TMP/dvt" &&
    pass "generate --draft-vocab 1024: speculative tokens (chains, trees) equal target-only tokens" ||
    fail "generate --draft-vocab 1024: $(diff "$TMP/dvs" "$TMP/dvt" | head -c 300)"
expect_exit 0 "bench --draft-vocab 4096" "$TANDEM" bench -m "$TARGET" -d "$DRAFT" -p 16 -n 8 --reps 1 --draft-vocab 4096
printf 'def f(x):\n' >"$TMP/dvchat.in"
STDIN="$TMP/dvchat.in" expect_exit 0 "chat --draft-vocab auto" "$TANDEM" chat -m "$TARGET" -d "$DRAFT" \
    --chat-template chatml --draft-vocab auto -n 4
expect_exit 2 "generate --draft-vocab 100" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --draft-vocab 100
expect_err "option --draft-vocab: '100' is not auto, 0 (the whole vocabulary) or a number of tokens >= 1024" \
    "generate --draft-vocab 100"
expect_exit 1 "generate --draft-vocab 8193" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p x --draft-vocab 8193
expect_err "draft_vocab 8193 is out of range: -1 (auto), 0 (the whole vocabulary) or a number of tokens in [1024, 8192]" \
    "generate --draft-vocab 8193"
expect_exit 2 "serve --draft-vocab without -d" "$TANDEM" serve -m "$TARGET" --draft-vocab 2048
expect_err "option --draft-vocab has no effect without -d DRAFT" "serve --draft-vocab without -d"
expect_exit 2 "generate --kv-type q4" "$TANDEM" generate -m "$TARGET" -p x --kv-type q4
expect_err "option --kv-type: unknown KV cache type 'q4' (expected auto, f32, f16, q8_0 or fp8)" "generate --kv-type q4"
expect_exit 2 "bench --kv-type ''" "$TANDEM" bench -m "$TARGET" --kv-type ''
expect_exit 2 "chat --kv-type Q8_0" "$TANDEM" chat -m "$TARGET" --kv-type Q8_0
expect_err "unknown KV cache type 'Q8_0'" "chat --kv-type Q8_0"

# -------------------------------------------------------------------- chat
# The shipped model has no chat template: --chat-template chatml renders its prompts.
printf '%s' '[{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]' >"$TMP/msgs.json"
CHATML=$(printf '<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\ndef fib(n):<|im_end|>\n<|im_start|>assistant\n.')
CHATML=${CHATML%.} # (the substitution would drop the final newline)
expect_exit 0 "generate --messages --chat-template chatml" \
    "$TANDEM" generate -m "$TARGET" --messages "$TMP/msgs.json" --chat-template chatml -n 8 --json
cp "$TMP/out" "$TMP/chat1.json"
expect_exit 0 "generate -p (the chatml text by hand)" "$TANDEM" generate -m "$TARGET" -p "$CHATML" -n 8 --json
if python3 - "$TMP/chat1.json" "$TMP/out" <<'PY'
import json, sys
a, b = (json.loads(open(f).readline()) for f in sys.argv[1:3])
sys.exit(0 if a["tokens"] == b["tokens"] and a["prompt_tokens"] == b["prompt_tokens"] else 1)
PY
then pass "generate --messages: the prompt is the rendered conversation"; else fail "generate --messages: prompt differs from the chatml text"; fi
expect_exit 1 "generate --messages: the model has no template" "$TANDEM" generate -m "$TARGET" --messages "$TMP/msgs.json" -n 4
expect_err "no chat template" "generate --messages without a template"
expect_exit 1 "generate --chat-template bogus" "$TANDEM" generate -m "$TARGET" --messages "$TMP/msgs.json" --chat-template bogus
expect_err "unknown chat template 'bogus' (built-in: chatml" "generate --chat-template bogus"
expect_exit 2 "generate --chat-template without --chat" "$TANDEM" generate -m "$TARGET" -p x --chat-template chatml
expect_exit 2 "generate: -p and --messages" "$TANDEM" generate -m "$TARGET" -p x --messages "$TMP/msgs.json"
printf '{"role": "user"}' >"$TMP/notarray.json"
expect_exit 1 "generate --messages: not an array" "$TANDEM" generate -m "$TARGET" --messages "$TMP/notarray.json" --chat-template chatml
expect_err "expected an array of messages" "generate --messages: not an array"
printf '{{ raise_exception("no " ~ messages[0].role) }}' >"$TMP/raise.jinja"
expect_exit 1 "generate --chat-template FILE raising" "$TANDEM" generate -m "$TARGET" --messages "$TMP/msgs.json" --chat-template "$TMP/raise.jinja"
expect_err "line 1, column 4: raise_exception: no system" "generate --chat-template FILE raising"
printf '%s\n' '{"id": "a", "messages": [{"role": "user", "content": "import os"}], "max_tokens": 4}' \
    '{"id": "b", "prompt": "def g():", "max_tokens": 4}' >"$TMP/chatp.jsonl"
expect_exit 0 "generate --prompts with messages lines --chat" \
    "$TANDEM" generate -m "$TARGET" --prompts "$TMP/chatp.jsonl" --chat --chat-template chatml --json
[ "$(wc -l <"$TMP/out")" -eq 2 ] && pass "generate --prompts --chat: two results" || fail "generate --prompts --chat: $(wc -l <"$TMP/out") lines"
printf '%s\n' '{"id": 1, "messages": [{"content": "no role"}]}' >"$TMP/badmsg.jsonl"
expect_exit 1 "generate --prompts: a message without a role" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/badmsg.jsonl"
expect_err 'badmsg.jsonl:1: "messages" must be an array of objects with a string "role"' "generate --prompts: bad messages"
printf '%s\n' '{"id": 1, "messages": [{"role": "user", "content": "x"}], "prompt": "y"}' >"$TMP/both.jsonl"
expect_exit 1 "generate --prompts: prompt and messages" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/both.jsonl"
expect_err 'not both' "generate --prompts: prompt and messages"

# tandem run: inputs with "messages" rendered by [job] chat_template; one that the
# template refuses is that input's error, the others run.
printf '%s\n' '{"id": "ok", "messages": [{"role": "user", "content": "import os"}]}' \
    '{"id": "bad", "messages": [{"role": "tool", "content": "x"}]}' >"$TMP/chatjob.jsonl"
cat >"$TMP/chatjob.ini" <<EOF
[model]
target = $TARGET
[sampling]
max_tokens = 4
[job]
input = chatjob.jsonl
output = chatjob.out
chat_template = {% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}{{ m.content }}{% endfor %}
EOF
rm -f "$TMP/chatjob.out"
"$TANDEM" run "$TMP/chatjob.ini" >/dev/null 2>"$TMP/err"
if [ $? -eq 1 ] && grep -q '"id": "ok", "text"' "$TMP/chatjob.out" && grep -q '"id": "bad", "error": ".*raise_exception: no tools' "$TMP/chatjob.out"; then
    pass "run: messages rendered, a refused one is its input's error"
else
    fail "run: messages: $(head -c 400 "$TMP/chatjob.out")"
fi

# tandem chat through a pipe: each turn's reply is what generate gives for the
# conversation so far (the history kept), /reset forgets it, /exit ends the input.
printf 'def add(a, b):\nreturn a\n/reset\nimport os\n/exit\nignored\n' >"$TMP/chat.in"
STDIN="$TMP/chat.in" expect_exit 0 "chat: a piped conversation" \
    "$TANDEM" chat -m "$TARGET" -d "$DRAFT" --chat-template chatml --system "You write Python." -n 12
cp "$TMP/out" "$TMP/chat.out"
if python3 - "$TANDEM" "$TARGET" "$TMP" <<'PY'
import json, subprocess, sys
tandem, target, tmp = sys.argv[1:4]
def gen(msgs):
    open(tmp + "/turn.json", "w").write(json.dumps(msgs))
    r = subprocess.run([tandem, "generate", "-m", target, "--messages", tmp + "/turn.json", "--chat-template",
                        "chatml", "-n", "12", "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["text"]
sys_m = {"role": "system", "content": "You write Python."}
h = [sys_m, {"role": "user", "content": "def add(a, b):"}]
r1 = gen(h)
h += [{"role": "assistant", "content": r1}, {"role": "user", "content": "return a"}]
r2 = gen(h)
r3 = gen([sys_m, {"role": "user", "content": "import os"}])
want = r1 + "\n" + r2 + "\n" + r3 + "\n"
got = open(tmp + "/chat.out").read()
if got != want:
    print("chat output %r\nexpected    %r" % (got, want))
    sys.exit(1)
PY
then pass "chat: replies follow the kept history, /reset and /exit"; else fail "chat: replies differ from generate's"; fi
STDIN="$TMP/chat.in" expect_exit 1 "chat: the model has no template" "$TANDEM" chat -m "$TARGET" -n 4
expect_err "no chat template" "chat without a template"
expect_exit 2 "chat: -p is not an option" "$TANDEM" chat -m "$TARGET" -p x
# ------------------------------------------------------------------- quantize
expect_exit 2 "quantize: missing --type" "$TANDEM" quantize "$TARGET" "$TMP/q.gguf"
expect_exit 2 "quantize: unknown type" "$TANDEM" quantize "$TARGET" "$TMP/q.gguf" --type q7_k
grep -q "q4_k_m" "$TMP/err" || fail "quantize: unknown type message lists the types"
expect_exit 2 "quantize: missing OUT" "$TANDEM" quantize "$TARGET" --type q8_0
expect_exit 2 "quantize: OUT is IN" "$TANDEM" quantize "$TARGET" "$TARGET" --type q8_0
expect_exit 1 "quantize: missing IN" "$TANDEM" quantize "$TMP/none.gguf" "$TMP/q.gguf" --type q8_0
# a NaN in an f16 matrix: no quantisation of it (each type's rounding of NaN is undefined)
gguf_patch "$TARGET" "$TMP/nan16.gguf" blk.0.attn_q.weight nan || fail "writing a NaN f16 copy"
for ty in q8_0 q4_0 q4_k; do
    expect_exit 1 "quantize $ty: a NaN weight" "$TANDEM" quantize "$TMP/nan16.gguf" "$TMP/q.gguf" --type $ty
    expect_err "tensor 'blk.0.attn_q.weight': row 0 holds NaN" "quantize $ty: a NaN weight"
done
rm -f "$TMP/nan16.gguf"
[ ! -e "$TMP/q.gguf" ] && [ ! -e "$TMP/q.gguf.tmp" ] && pass "quantize: a failed run leaves no file" ||
    fail "quantize: a failed run left a file"
expect_exit 0 "quantize q4_k_m" "$TANDEM" quantize "$TARGET" "$TMP/q.gguf" --type q4_k_m
grep -q "q6_k" "$TMP/out" && grep -q "q5_0" "$TMP/out" || fail "quantize: summary lists the types ($(cat "$TMP/out"))"
grep -q "blk.7.ffn_down.weight -> q6_k" "$TMP/err" || fail "quantize: progress lines name tensors and types"
expect_exit 0 "quantize: the q4_k_m model generates" "$TANDEM" generate -m "$TMP/q.gguf" -p "def add(a, b):" -n 8
expect_exit 1 "quantize: an existing OUT" "$TANDEM" quantize "$TARGET" "$TMP/q.gguf" --type q8_0
grep -q "use --force" "$TMP/err" || fail "quantize: existing OUT message"
expect_exit 0 "quantize --force q6_k" "$TANDEM" quantize --force "$TARGET" "$TMP/q.gguf" --type q6_k
"$TANDEM" info "$TMP/q.gguf" 2>/dev/null | grep -q "blk.0.ffn_down.weight *q6_k" && pass "quantize: q6_k rows of 1024" ||
    fail "quantize: q6_k tensor types"

# ------------------------------------------------------------ grammar, json schema
printf 'root ::= "def " [a-z_]+ "(" [a-z, ]* "):\\n    return " [a-z0-9_ +*]+ "\\n"\n' >"$TMP/g.gbnf"
printf '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}' >"$TMP/s.json"
expect_exit 0 "generate --grammar" "$TANDEM" generate -m "$TARGET" -p "import os" --grammar "$TMP/g.gbnf" -n 40
head -c 4 "$TMP/out" | grep -q '^def ' && pass "generate --grammar: the text follows the grammar" ||
    fail "generate --grammar: $(head -c 200 "$TMP/out")"
expect_exit 0 "generate --grammar with a draft" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p "import os" --grammar "$TMP/g.gbnf" -n 40
cp "$TMP/out" "$TMP/g_spec.out"
"$TANDEM" generate -m "$TARGET" -p "import os" --grammar "$TMP/g.gbnf" -n 40 >"$TMP/g_plain.out" 2>/dev/null
cmp -s "$TMP/g_spec.out" "$TMP/g_plain.out" && pass "generate --grammar: the draft changes nothing (greedy)" ||
    fail "generate --grammar: with and without a draft differ"
expect_exit 0 "generate --json-schema" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p "x = " --json-schema "$TMP/s.json" -n 40 --json
python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).read())["text"]; v=json.loads(t); assert list(v)==["n"] and isinstance(v["n"], int)' "$TMP/out" &&
    pass "generate --json-schema: the text is the schema's JSON" || fail "generate --json-schema: $(head -c 300 "$TMP/out")"
expect_exit 2 "generate: --grammar and --json-schema" "$TANDEM" generate -m "$TARGET" -p x --grammar "$TMP/g.gbnf" --json-schema "$TMP/s.json"
expect_exit 1 "generate --grammar: a missing file" "$TANDEM" generate -m "$TARGET" -p x --grammar "$TMP/none.gbnf"
printf 'root ::= "a" b\n' >"$TMP/bad.gbnf"
expect_error "generate --grammar: an undefined rule" "grammar: line 1:" "$TANDEM" generate -m "$TARGET" -p x --grammar "$TMP/bad.gbnf"
printf '%s\n' '{"id": 1, "prompt": "x = ", "json_schema": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}, "max_tokens": 30}' \
    '{"id": 2, "prompt": "import os", "grammar": "root ::= \"def \" [a-z]+", "max_tokens": 8}' \
    '{"id": 3, "prompt": "import os", "max_tokens": 4}' >"$TMP/gp.jsonl"
expect_exit 0 "generate --prompts with grammar / json_schema lines" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/gp.jsonl" --json
python3 - "$TMP/out" <<'PY' && pass "prompts: each line's constraint" || fail "prompts: a line's constraint ($(head -c 300 "$TMP/out"))"
import json, sys, re
rs = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
assert isinstance(json.loads(rs[1]["text"])["a"], bool)
assert re.fullmatch(r"def [a-z]+", rs[2]["text"]), rs[2]["text"]
PY
check_bad_prompts "grammar and json_schema" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}'$'\n'
expect_err 'give "grammar" or "json_schema", not both' "prompts: grammar and json_schema"
check_bad_prompts "grammar not a string" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "grammar": 3}'$'\n'
expect_err '"grammar" must be a string' "prompts: grammar 3"

# ------------------------------------------------------------ penalties, logit_bias, min_tokens, logprobs
PEN=(--presence-penalty 0.5 --frequency-penalty 0.8 --repetition-penalty 1.3 --min-tokens 5 --logit-bias 263=-100,7=2.5)
expect_exit 0 "generate with the penalties and --logprobs 3" "$TANDEM" generate -m "$TARGET" -p "def fib(n):" -n 20 "${PEN[@]}" --logprobs 3 --json
cp "$TMP/out" "$TMP/pen_plain.out"
expect_exit 0 "generate with the penalties, a draft" "$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p "def fib(n):" -n 20 "${PEN[@]}" --logprobs 3 --json
python3 - "$TMP/pen_plain.out" "$TMP/out" <<'PY' && pass "generate --logprobs: an entry per token, 3 alternatives; the draft changes no token, no logprob (1e-4)" ||
import json, sys
a, b = (json.loads(open(f).read()) for f in sys.argv[1:3])
assert a["tokens"] == b["tokens"] and 263 not in a["tokens"], (a["tokens"], b["tokens"])
assert len(a["logprobs"]) == len(a["tokens"]) and all(len(e["top_logprobs"]) == 3 for e in a["logprobs"])
assert all(abs(x["logprob"] - y["logprob"]) < 1e-4 for x, y in zip(a["logprobs"], b["logprobs"]))
assert all(e["top_logprobs"][0]["id"] == t for e, t in zip(a["logprobs"], a["tokens"]))
PY
    fail "generate --logprobs: $(head -c 300 "$TMP/out")"
expect_exit 0 "generate --logprobs (text)" "$TANDEM" generate -m "$TARGET" -p "def fib(n):" -n 3 --logprobs 1
[ "$(grep -c '^\[logprobs\] ' "$TMP/err")" -eq 3 ] && pass "generate --logprobs: a line per token on stderr" ||
    fail "generate --logprobs (text): $(head -c 300 "$TMP/err")"
expect_exit 2 "generate --presence-penalty 3" "$TANDEM" generate -m "$TARGET" -p x --presence-penalty 3
expect_err "--presence-penalty: 3 is out of range [-2, 2]" "generate --presence-penalty 3"
expect_exit 2 "generate --repetition-penalty 0" "$TANDEM" generate -m "$TARGET" -p x --repetition-penalty 0
expect_exit 2 "generate --logprobs 21" "$TANDEM" generate -m "$TARGET" -p x --logprobs 21
expect_exit 2 "generate --logit-bias 5=101" "$TANDEM" generate -m "$TARGET" -p x --logit-bias 5=101
expect_err "--logit-bias: '5=101'" "generate --logit-bias 5=101"
expect_exit 2 "generate --logit-bias 5" "$TANDEM" generate -m "$TARGET" -p x --logit-bias 5
expect_error "generate --logit-bias out of the vocabulary" "logit_bias: token 999999 is out of range" "$TANDEM" generate -m "$TARGET" -p x --logit-bias 999999=1
printf '%s\n' '{"id": 1, "prompt": "def fib(n):", "max_tokens": 6, "logprobs": 2, "repetition_penalty": 1.5, "logit_bias": {"263": -100}}' \
    '{"id": 2, "prompt": "def fib(n):", "max_tokens": 6}' >"$TMP/lp.jsonl"
expect_exit 0 "generate --prompts with penalties / logprobs lines" "$TANDEM" generate -m "$TARGET" --prompts "$TMP/lp.jsonl" --json
python3 - "$TMP/out" <<'PY' && pass "prompts: a line's logprobs, repetition_penalty and logit_bias" || fail "prompts: penalties ($(head -c 300 "$TMP/out"))"
import json, sys
rs = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
assert len(rs[1]["logprobs"]) == len(rs[1]["tokens"]) and 263 not in rs[1]["tokens"]
assert "logprobs" not in rs[2] and rs[2]["tokens"][0] == 263, rs[2]
PY
check_bad_prompts "logprobs 21" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "logprobs": 21}'$'\n'
expect_err '"logprobs" must be an integer in [0, 20]' "prompts: logprobs 21"
check_bad_prompts "logit_bias of a word" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "logit_bias": {"a": 1}}'$'\n'
expect_err '"logit_bias": "a" must be a token id' "prompts: logit_bias {a: 1}"
check_bad_prompts "presence_penalty 5" "$GOOD"$'\n\n''{"id": 2, "prompt": "x", "presence_penalty": 5}'$'\n'
expect_err '"presence_penalty" must be a number in [-2, 2]' "prompts: presence_penalty 5"

cli_done
