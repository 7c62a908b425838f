#!/usr/bin/env bash
# usage: scripts/fuzz.sh [SECONDS [NAME...]]
#
# Builds every libFuzzer harness of tests/fuzz/ (fuzz_NAME.c) with clang
# -fsanitize=fuzzer,address,undefined into build-fuzz/ (each source compiled once,
# one per core, into build-fuzz/obj/), seeds each one's corpus from
# the checked-in examples (configs/*.ini, tests/data/*.jsonl, the GGUF files' heads,
# the tokenizer cases, the chat templates, example server requests) and runs it for SECONDS (default 20), two at a time (NAME...:
# only those, e.g. `scripts/fuzz.sh 300 config prompts`).  The
# corpora stay in build-fuzz/corpus/NAME (a later run starts from them); crashes go
# to build-fuzz/crashes/.  Exit status: 0 when no harness crashed, 1 when one did (the
# reproducer's path is printed: rerun it with build-fuzz/fuzz_NAME PATH) or a build
# failed, 77 when clang or its libFuzzer is missing (nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
case "$SECS" in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS [NAME...]]" >&2; exit 2 ;; esac
shift $(($# > 0 ? 1 : 0))
OUT=build-fuzz
CC=${CLANG:-clang}
JOBS=$(nproc 2>/dev/null || echo 2)
FLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE -Iinclude -Isrc/base -Isrc/gguf -Isrc/tokenizer -Isrc/chat -Isrc/grammar -Isrc/request -Isrc/cli -Isrc/server -Idraft)
JSON_SRC=(src/base/json.c src/base/unicode.c src/base/unicode_data.c src/base/common.c)
GGUF_SRC=(src/gguf/gguf.c src/gguf/ggml_types.c src/base/dtype.c src/base/dtype_quant.c src/base/dtype_kquant.c "${JSON_SRC[@]}")
TOK_SRC=(src/tokenizer/tokenizer.c src/tokenizer/tok_bpe.c src/tokenizer/tok_spm.c src/tokenizer/tok_pretok.c src/tokenizer/tok_pretok_rules.c src/tokenizer/tok_pretok_names.c "${GGUF_SRC[@]}")
GRAMMAR_SRC=(src/grammar/grammar_parse.c src/grammar/grammar_check.c src/grammar/gmatch.c src/grammar/gmask.c src/grammar/gshare.c)
PROMPT_SRC=(src/cli/prompts.c src/cli/input.c src/request/stop_arg.c "${JSON_SRC[@]}")
JINJA_SRC=(src/chat/jinja/lexer.c src/chat/jinja/parser.c src/chat/jinja/parse_stmt.c src/chat/jinja/eval.c src/chat/jinja/ops.c
    src/chat/jinja/value.c src/chat/jinja/strings.c src/chat/jinja/filters.c src/chat/jinja/tests.c src/chat/jinja/methods.c "${JSON_SRC[@]}")
HARNESSES=(gguf json tokenizer config prompts chat_template oai_request grammar json_schema)
[ $# -gt 0 ] && HARNESSES=("$@")

# The library sources, extra link flags and -max_len of each harness.
sources() {
    case $1 in
    gguf) echo "${GGUF_SRC[@]}" ;;
    json) echo "${JSON_SRC[@]}" ;;
    tokenizer) echo "${TOK_SRC[@]}" ;;
    config) echo src/cli/job_config.c src/request/spec_tree_arg.c draft/tree_shape.c "${PROMPT_SRC[@]}" ;;
    prompts) echo "${PROMPT_SRC[@]}" ;;
    chat_template) echo "${JINJA_SRC[@]}" ;;
    grammar) echo "${GRAMMAR_SRC[@]}" "${TOK_SRC[@]}" ;;
    json_schema) echo src/grammar/json_schema.c "${GRAMMAR_SRC[@]}" "${TOK_SRC[@]}" ;;
    oai_request) echo src/server/oai_request.c src/server/oai_chat.c src/server/oai_refused.c src/server/oai_response.c src/chat/tool_calls.c src/request/spec_tree_arg.c draft/tree_shape.c "${PROMPT_SRC[@]}" ;;
    esac
}
libs() { [ "$1" = config ] && pkg-config --libs inih; echo -lm; }
max_len() { case $1 in prompts | chat_template) echo 8192 ;; *) echo 4096 ;; esac; }

if ! command -v "$CC" >/dev/null 2>&1; then
    echo "fuzz: skipped: $CC not found (scripts/setup.sh installs it)"
    exit 77
fi
mkdir -p "$OUT/crashes"
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; return (int)(n & 0); }' >"$OUT/probe.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$OUT/probe.c" -o "$OUT/probe" 2>"$OUT/probe.log"; then
    echo "fuzz: skipped: $CC cannot link -fsanitize=fuzzer (no libFuzzer): $(head -n 1 "$OUT/probe.log")"
    exit 77
fi

# Whether fuzz_NAME must be built: it is missing, or older than this script, its
# harness or a source or header of the library's folders.
stale() {
    local exe=$OUT/fuzz_$1
    [ ! -x "$exe" ] ||
        [ -n "$(find scripts/fuzz.sh "tests/fuzz/fuzz_$1.c" include src draft \( -name '*.[ch]' -o -name fuzz.sh \) \
            -newer "$exe" | head -n 1)" ]
}
obj() { local o=${1//\//_}; echo "$OUT/obj/${o%.c}.o"; }

# Builds the stale harnesses: every source they need compiled once (a library source
# is shared by several harnesses), JOBS at a time, into build-fuzz/obj/, then each
# harness linked.  Returns 1 (after saying which) when a compile or a link fails.
build_all() {
    local h s todo=() srcs=() pids=() failed=0
    local -A seen=()
    for h in "${HARNESSES[@]}"; do stale "$h" && todo+=("$h"); done
    [ ${#todo[@]} -eq 0 ] && return 0
    for h in "${todo[@]}"; do
        for s in "tests/fuzz/fuzz_$h.c" $(sources "$h"); do
            [ -n "${seen[$s]:-}" ] || { seen[$s]=1; srcs+=("$s"); }
        done
    done
    mkdir -p "$OUT/obj"
    for s in "${srcs[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        { "$CC" "${FLAGS[@]}" -c "$s" -o "$(obj "$s")" || { echo "fuzz: FAILED to compile $s"; exit 1; }; } &
        pids+=($!)
    done
    for s in "${pids[@]}"; do wait "$s" || failed=1; done
    [ "$failed" -eq 0 ] || return 1
    pids=()
    for h in "${todo[@]}"; do
        local objs=()
        for s in "tests/fuzz/fuzz_$h.c" $(sources "$h"); do objs+=("$(obj "$s")"); done
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        # shellcheck disable=SC2046
        { "$CC" "${FLAGS[@]}" "${objs[@]}" $(libs "$h") -o "$OUT/fuzz_$h" || { echo "fuzz: FAILED to build fuzz_$h"; exit 1; }; } &
        pids+=($!)
    done
    for s in "${pids[@]}"; do wait "$s" || failed=1; done
    return "$failed"
}

# The seed corpus of each harness, from files in the repository (small pieces: the
# fuzzer cuts inputs to -max_len anyway).
seed() {
    local h=$1 d=$OUT/seeds/$1 f i=0
    rm -rf "$d" && mkdir -p "$d"
    case $h in
    gguf)
        for f in tests/data/vocab/*.gguf models/*.gguf; do
            [ -f "$f" ] && head -c 4096 "$f" >"$d/$(basename "$f")"
        done ;;
    json | prompts)
        for f in tests/data/*.jsonl tests/data/vocab/*.jsonl; do
            head -n 8 "$f" | head -c "$(max_len "$h")" >"$d/$(basename "$f")"
            [ "$h" = json ] && head -n 1 "$f" | head -c 4096 >"$d/line1-$(basename "$f")"
        done
        printf '%s\n' '{"id": "a", "prompt": "x", "priority": -3, "timeout_s": 0.5, "stop": ["\n\n", "def "]}' \
            '{"id": 2, "prompt": "y", "stop": "\u0000", "max_tokens": 4, "seed": 18446744073709551615}' \
            '{"id": 1e3, "prompt": "z", "temperature": 0.7, "stop": []}' >"$d/fields.jsonl" ;;
    tokenizer)
        python3 - "$d" <<'PY'
import json, sys
for i, l in enumerate(open("tests/data/tokenizer-cases.jsonl", encoding="utf-8")):
    if l.strip():
        open("%s/case%d" % (sys.argv[1], i), "wb").write(bytes([i % 3]) + json.loads(l)["text"].encode()[:4000])
PY
        ;;
    chat_template) # the real templates, each after a byte that picks the conversation
        for f in tests/data/chat/*.jinja; do
            { printf '\001'; head -c 8000 "$f"; } >"$d/$(basename "$f")"
            { printf '\202'; head -c 8000 "$f"; } >"$d/agp-$(basename "$f")"
        done ;;
    oai_request) # example request bodies, each after a byte that picks the endpoint and limits
        local b bodies=(
            '{"model": "pycode", "prompt": "def f():", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n\n", "def "], "n": 1}'
            '{"prompt": [0, 5, 511], "stream": true, "stream_options": {"include_usage": true}, "priority": 2, "timeout_s": 1.5, "spec_k": 4, "spec_tree": "off"}'
            '{"prompt": ["x"], "max_tokens": 300, "logprobs": null, "echo": false, "best_of": 1, "presence_penalty": 0, "user": "u"}'
            '{"model": "pycode", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": null}], "max_completion_tokens": 8, "stream": true}'
            '{"messages": [{"role": "user", "content": "\u00e9\ud83d\ude00"}], "stop": "\n", "response_format": {"type": "text"}}'
            '{"model": "other", "prompt": "x", "n": 2, "max_tokens": "16"}'
            '{"messages": [{"role": "user", "content": "w?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"c\": \"P\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "name": "w", "content": "18"}, {"role": "assistant", "content": "ok <tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call><|python_tag|>{\"name\": \"w\", \"parameters\": {}}[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}]"}], "tools": [{"type": "function", "function": {"name": "w", "description": "d", "parameters": {"type": "object"}}}], "tool_choice": "auto", "parallel_tool_calls": false}')
        for b in "${bodies[@]}"; do
            i=$((i + 1))
            { printf '\000'; printf '%s' "$b"; } >"$d/completion$i"
            { printf '\007'; printf '%s' "$b"; } >"$d/chat$i"
            { printf '\212'; printf '%s' "$b"; } >"$d/draft$i"
            { printf '\107'; printf '%s' "$b"; } >"$d/hermes$i" # (bits 6-7: the tool call format)
            { printf '\207'; printf '%s' "$b"; } >"$d/llama3$i"
            { printf '\307'; printf '%s' "$b"; } >"$d/mistral$i"
        done ;;
    grammar) # the test grammars, one a file
        printf '%s\n' 'root ::= object' 'object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws' \
            'value ::= object | [0-9]+ ws | string' 'string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ["\\/bfnrt] )* "\"" ws' \
            'ws ::= | " " | "\n" [ \t]{0,20}' >"$d/json.gbnf"
        printf 'root ::= (x | "ab"){2,5} [^a-c\\n]* .? "\\u00e9"\nx ::= ("y" x?)+ # c\n' >"$d/rep.gbnf"
        printf 'root ::= a\na ::= "(" a* ")" | [\\U0001F600-\\U0001F64F]\n' >"$d/rec.gbnf" ;;
    json_schema)
        printf '%s' '{"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 300}, "b": {"type": "array", "items": {"type": "string", "format": "date"}, "minItems": 1, "maxItems": 3}}, "required": ["a"], "additionalProperties": false}' >"$d/obj.json"
        printf '%s' '{"$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}]}}, "$ref": "#/$defs/n"}' >"$d/ref.json"
        printf '%s' '{"enum": ["a", 1, null, {"x": [true]}], "title": "t"}' >"$d/enum.json"
        printf '%s' '{"type": ["string", "null"], "minLength": 2, "maxLength": 5}' >"$d/types.json" ;;
    config)
        for f in configs/*.ini; do cp "$f" "$d/"; done
        printf '[model]\ntarget = ../models/pycode-target-f16.gguf\n[sampling]\nstop = ["\\n\\n", "def "]\n[job]\ninput = ../tests/data/prompts-dev.jsonl\noutput = /dev/null\npriority = 2\ntimeout_s = 1.5\n' >"$d/fields.ini" ;;
    esac
}

# Runs one harness for SECS seconds; the log in build-fuzz/NAME.log.
fuzz() {
    local h=$1
    mkdir -p "$OUT/corpus/$h"
    TDM_REPO=$PWD "./$OUT/fuzz_$h" -max_len="$(max_len "$h")" -max_total_time="$SECS" -timeout=10 \
        -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$OUT/crashes/$h-" "$OUT/corpus/$h" "$OUT/seeds/$h" \
        >"$OUT/$h.log" 2>&1
}

t0=$(date +%s)
build_all || exit 1
for h in "${HARNESSES[@]}"; do seed "$h"; done
echo "fuzz: built ${#HARNESSES[@]} harnesses in $(( $(date +%s) - t0 )) s; running each for $SECS s, two at a time"
declare -A pid
for h in "${HARNESSES[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
    fuzz "$h" &
    pid[$h]=$!
done
status=0
for h in "${HARNESSES[@]}"; do
    wait "${pid[$h]}"
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/$h.log")
    if [ "$rc" -eq 0 ]; then
        echo "fuzz: fuzz_$h ok (${runs:-?} runs, corpus $(find "$OUT/corpus/$h" -type f | wc -l) inputs)"
    else
        status=1
        repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$OUT/$h.log" | tail -n 1)
        echo "fuzz: fuzz_$h FAILED (exit $rc); reproducer: ${repro:-none written}; log: $OUT/$h.log"
        grep -m 3 -E 'ERROR: |SUMMARY: |runtime error' "$OUT/$h.log" | sed 's/^/  /'
        [ -n "$repro" ] && echo "  rerun: TDM_REPO=\$PWD ./$OUT/fuzz_$h $repro"
    fi
done
echo "fuzz: $(( $(date +%s) - t0 )) s in all"
exit "$status"
