#!/usr/bin/env bash
# test_cli_jobs.sh - end-to-end checks of `tandem run` (batch jobs from INI files) and
# `tandem merge`: the same tokens as generate, resume, shards, bad configs and inputs,
# duplicate ids, locked and non-regular outputs, and writes that fail (a full disk, a
# read-only file system, on a small tmpfs when root; skipped otherwise).
#
# usage: tests/test_cli_jobs.sh path/to/tandem   (as tests/test_cli.sh)
. "$(dirname "$0")/cli_testlib.sh"

# what the jobs are checked against: generate's tokens of 12 dev prompts, with the
# draft (and with a q8_0 KV cache)
head -n 12 "$DATA/prompts-dev.jsonl" >"$TMP/p12.jsonl"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json 2>/dev/null | tokens >"$TMP/b1"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type q8_0 2>/dev/null |
    tokens >"$TMP/q8s"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" --prompts "$TMP/p12.jsonl" -n 10 --json --kv-type fp8 2>/dev/null |
    tokens >"$TMP/f8s"
[ "$(wc -l <"$TMP/b1")" -eq 12 ] && [ "$(wc -l <"$TMP/q8s")" -eq 12 ] && [ "$(wc -l <"$TMP/f8s")" -eq 12 ] ||
    { echo "FAIL - generate's reference tokens"; exit 1; }

# tandem run JOB.ini: the same tokens as generate; resumable; shards; bad configs
cat >"$TMP/job.ini" <<EOF
[model]
target = $TARGET
draft = $DRAFT
[engine]
threads = 2
max_batch = 5
[sampling]
max_tokens = 10
[job]
input = p12.jsonl
output = out.jsonl
EOF
rm -f "$TMP/out.jsonl"
expect_exit 0 "run: a job" "$TANDEM" run "$TMP/job.ini"
# (lines in the order the requests complete: compared sorted by id)
sort -n "$TMP/b1" >"$TMP/b1s"
tokens <"$TMP/out.jsonl" | sort -n >"$TMP/r1"
cmp -s "$TMP/b1s" "$TMP/r1" && pass "run: the tokens of generate, one line per prompt" ||
    fail "run: output differs from generate: $(diff "$TMP/b1s" "$TMP/r1" | head -c 300)"
grep -q "run: 12 requests (0 already done, 0 errors)" "$TMP/err" && pass "run: summary line" ||
    fail "run: summary: $(tail -n 1 "$TMP/err")"
grep -Eq "prefix cache [0-9]+ of [1-9][0-9]* prompt tokens \([0-9.]+%\), [0-9]+ preemptions, 0 timeouts" "$TMP/err" &&
    pass "run: the summary reports prefix-cache hits, preemptions, timeouts" || fail "run: summary: $(tail -n 1 "$TMP/err")"
{ head -n 5 "$TMP/out.jsonl"; sed -n 6p "$TMP/out.jsonl" | head -c 40; } >"$TMP/cut.jsonl"
mv "$TMP/cut.jsonl" "$TMP/out.jsonl"
expect_exit 0 "run: resumed after a kill" "$TANDEM" run "$TMP/job.ini"
grep -q "run: 7 requests (5 already done" "$TMP/err" && pass "run: the resumed job skips the 5 complete lines" ||
    fail "run: resume: $(tail -n 1 "$TMP/err")"
tokens <"$TMP/out.jsonl" | sort -n >"$TMP/r2"
cmp -s "$TMP/b1s" "$TMP/r2" && pass "run: after the resume every id once, nothing cut" ||
    fail "run: resumed output: $(diff "$TMP/b1s" "$TMP/r2" | head -c 300)"
# a line's grammar / json_schema constrains it in a job; a bad one fails that line alone
printf '%s\n' '{"id": 1, "prompt": "x = ", "json_schema": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}, "max_tokens": 30}' \
    '{"id": 2, "prompt": "import os", "grammar": "root ::= \"def \" [a-z]+", "max_tokens": 8}' \
    '{"id": 3, "prompt": "import os", "grammar": "root ::= undefined", "max_tokens": 8}' >"$TMP/pg.jsonl"
rm -f "$TMP/g.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=pg.jsonl --set job.output=g.jsonl >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && python3 - "$TMP/g.jsonl" <<'PY' && pass "run: each line's grammar / json_schema; a bad one is that line's error" ||
import json, sys, re
rs = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
assert isinstance(json.loads(rs[1]["text"])["a"], bool)
assert re.fullmatch(r"def [a-z]+", rs[2]["text"]), rs[2]["text"]
assert "grammar: line 1:" in rs[3]["error"], rs[3]
PY
    fail "run: constrained lines: $(head -c 400 "$TMP/g.jsonl") $(tail -c 200 "$TMP/err")"
# a line's penalties and logprobs in a job: the output line carries its logprobs
printf '%s\n' '{"id": 1, "prompt": "def fib(n):", "max_tokens": 6, "logprobs": 2, "frequency_penalty": 1, "logit_bias": {"263": -100}}' \
    '{"id": 2, "prompt": "def fib(n):", "max_tokens": 6, "min_tokens": 6}' >"$TMP/plp.jsonl"
rm -f "$TMP/lp.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=plp.jsonl --set job.output=lp.jsonl >/dev/null 2>"$TMP/err"
[ $? -eq 0 ] && python3 - "$TMP/lp.jsonl" <<'PY' && pass "run: a line's penalties and logprobs; logprobs in its output line" ||
import json, sys
rs = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
assert len(rs[1]["logprobs"]) == len(rs[1]["tokens"]) and all(len(e["top_logprobs"]) == 2 for e in rs[1]["logprobs"])
assert 263 not in rs[1]["tokens"] and "logprobs" not in rs[2] and len(rs[2]["tokens"]) == 6
PY
    fail "run: penalised lines: $(head -c 400 "$TMP/lp.jsonl") $(tail -c 200 "$TMP/err")"
rm -f "$TMP/s0.jsonl" "$TMP/s1.jsonl"
"$TANDEM" run "$TMP/job.ini" --shard 0/2 --set job.output=s0.jsonl 2>/dev/null
"$TANDEM" run "$TMP/job.ini" --shard 1/2 --set job.output=s1.jsonl 2>/dev/null
cat "$TMP/s0.jsonl" "$TMP/s1.jsonl" | tokens | sort -n >"$TMP/r3"
[ -s "$TMP/s0.jsonl" ] && [ -s "$TMP/s1.jsonl" ] && cmp -s "$TMP/b1s" "$TMP/r3" &&
    pass "run --shard 0/2 and 1/2: every id exactly once" || fail "run --shard: $(diff "$TMP/b1s" "$TMP/r3" | head -c 200)"
{ head -n 2 "$TMP/p12.jsonl"; echo '{"id": 2, "prompt": '; sed -n 4p "$TMP/p12.jsonl"; } >"$TMP/pmal.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=pmal.jsonl --set job.output=mal.jsonl >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q '"error": ".*pmal.jsonl:3: invalid JSON' "$TMP/mal.jsonl" && [ "$(wc -l <"$TMP/mal.jsonl")" -eq 4 ] &&
    pass "run: a malformed input line becomes an error line, the job goes on (exit 1)" ||
    fail "run: malformed line: $(head -c 300 "$TMP/mal.jsonl")"
badcfg() { # DESCRIPTION TEXT-EXPECTED-IN-STDERR INI-CONTENT
    printf '%b' "$3" >"$TMP/bad.ini"
    expect_exit 1 "run: $1" "$TANDEM" run "$TMP/bad.ini"
    expect_err "$2" "run: $1"
}
ok_head="[model]\ntarget = $TARGET\n[job]\ninput = p12.jsonl\noutput = o.jsonl\n"
# same_run DESCRIPTION SORTED-TOKENS-FILE --set ...: job.ini run with these settings
# gives those tokens (compared sorted by id)
same_run() {
    local desc=$1 want=$2
    shift 2
    rm -f "$TMP/same.jsonl"
    expect_exit 0 "run: $desc" "$TANDEM" run "$TMP/job.ini" "$@" --set job.output=same.jsonl
    tokens <"$TMP/same.jsonl" | sort -n >"$TMP/same"
    cmp -s "$want" "$TMP/same" && pass "run: $desc gives the expected tokens" ||
        fail "run: $desc: $(diff "$want" "$TMP/same" | head -c 300)"
}
badcfg "unknown key" "bad.ini:7: [engine] colour: unknown key" "$ok_head[engine]\ncolour = red\n"
badcfg "bad value" "bad.ini:7: [engine] max_batch: 'many' is not an integer in [1, 1024]" "$ok_head[engine]\nmax_batch = many\n"
badcfg "unknown section" "bad.ini:7: [modle] x: unknown section [modle]" "$ok_head[modle]\nx = 1\n"
badcfg "missing model file" "bad.ini:2: [model] target: $TMP/nope.gguf: no such file" "[model]\ntarget = nope.gguf\n[job]\ninput = p12.jsonl\noutput = o.jsonl\n"
badcfg "missing input file" "bad.ini:4: [job] input: $TMP/none.jsonl: no such file" "[model]\ntarget = $TARGET\n[job]\ninput = none.jsonl\noutput = o.jsonl\n"
badcfg "required key" "[job] output: required" "[model]\ntarget = $TARGET\n[job]\ninput = p12.jsonl\n"
badcfg "not INI" "bad.ini:1: not INI syntax" "target model\n"
badcfg "temperature out of range" "bad.ini:7: [sampling] temperature: '-1' is not a number >= 0" "$ok_head[sampling]\ntemperature = -1\n"
badcfg "k without a draft" "[spec] k: needs [model] draft" "$ok_head[spec]\nk = 4\n"
badcfg "tree without a draft" "[spec] tree: needs [model] draft" "$ok_head[spec]\ntree = 16\n"
badcfg "bad tree" "bad.ini:7: [spec] tree: 'lots' is not off, auto, a node budget 1..64" "$ok_head[spec]\ntree = lots\n"
badcfg "bad tree shape" "bad.ini:7: [spec] tree: tree shape '8,8' has 72 nodes; at most 64" "$ok_head[spec]\ntree = 8,8\n"
badcfg "kv_type" "bad.ini:7: [engine] kv_type: 'int8' is not auto, f32, f16, q8_0 or fp8" "$ok_head[engine]\nkv_type = int8\n"
sort -n "$TMP/q8s" -o "$TMP/q8s" # (generate --kv-type q8_0's tokens)
same_run "[engine] kv_type = q8_0" "$TMP/q8s" --set engine.kv_type=q8_0
sort -n "$TMP/f8s" -o "$TMP/f8s" # (generate --kv-type fp8's tokens)
same_run "[engine] kv_type = fp8" "$TMP/f8s" --set engine.kv_type=fp8
badcfg "tensor_parallel" "bad.ini:7: [engine] tensor_parallel: '0' is not an integer in [1, 8]" "$ok_head[engine]\ntensor_parallel = 0\n"
badcfg "draft_vocab" "bad.ini:7: [engine] draft_vocab: '500' is not auto, 0 (the whole vocabulary) or a number of tokens >= 1024" \
    "$ok_head[engine]\ndraft_vocab = 500\n"
# [engine] draft_vocab reaches the engine: the draft's head over 1024 of pycode's 8192
# tokens gives generate's tokens; a value past the vocabulary is the engine's error
same_run "[engine] draft_vocab = 1024" "$TMP/b1s" --set engine.draft_vocab=1024
rm -f "$TMP/dvrun.jsonl"
expect_exit 1 "run: [engine] draft_vocab = 9000" "$TANDEM" run "$TMP/job.ini" --set engine.draft_vocab=9000 \
    --set job.output=dvrun.jsonl
expect_err "draft_vocab 9000 is out of range" "run: [engine] draft_vocab = 9000"
badcfg "ctx" "bad.ini:7: [engine] ctx: '0' is not an integer in [1, 16777216]" "$ok_head[engine]\nctx = 0\n"
# [engine] ctx reaches the engine: a context of 4 tokens fits none of the prompts
rm -f "$TMP/ctxrun.jsonl"
"$TANDEM" run "$TMP/job.ini" --set engine.ctx=4 --set job.output=ctxrun.jsonl >/dev/null 2>&1
grep -q 'does not fit the context of 4 ' "$TMP/ctxrun.jsonl" && pass "run: [engine] ctx = 4 is the engine's context" ||
    fail "run: [engine] ctx = 4: $(head -c 300 "$TMP/ctxrun.jsonl")"
# tensor parallelism (the target split 2 ways; on the CPU its shards run in turn):
# the same tokens as the whole model, through run, generate and bench
same_run "[engine] tensor_parallel = 2" "$TMP/b1s" --set engine.tensor_parallel=2
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p "def add(a, b):" -n 16 --json 2>/dev/null | tokens >"$TMP/tpw"
"$TANDEM" generate -m "$TARGET" -d "$DRAFT" -p "def add(a, b):" -n 16 --json --tensor-parallel 2 --spec-tree 8 \
    2>/dev/null | tokens >"$TMP/tps"
[ -s "$TMP/tpw" ] && cmp -s "$TMP/tpw" "$TMP/tps" && pass "generate --tensor-parallel 2 --spec-tree 8: the whole model's tokens" ||
    fail "generate --tensor-parallel 2: $(cat "$TMP/tps")"
expect_exit 1 "generate: --tensor-parallel 3 on 2 KV heads" "$TANDEM" generate -m "$TARGET" -p x --tensor-parallel 3
expect_err "2 KV heads do not divide by 3" "generate: --tensor-parallel 3"
expect_exit 2 "generate: --tensor-parallel 9" "$TANDEM" generate -m "$TARGET" -p x --tensor-parallel 9
expect_exit 0 "bench --tensor-parallel 2" "$TANDEM" bench -m "$TARGET" -p 16 -n 8 --reps 1 --tensor-parallel 2 -t 2
expect_exit 1 "run --set with a bad key" "$TANDEM" run "$TMP/job.ini" --set engine.colour=red
expect_err "--set: [engine] colour: unknown key" "run --set with a bad key"
expect_exit 1 "run --set without a section" "$TANDEM" run "$TMP/job.ini" --set colour=red
expect_exit 2 "run --shard 2/2" "$TANDEM" run "$TMP/job.ini" --shard 2/2
expect_exit 2 "run without a job file" "$TANDEM" run
expect_exit 0 "run: configs/pycode-cpu.ini" "$TANDEM" run "$HERE/../configs/pycode-cpu.ini" --set sampling.max_tokens=2 \
    --set job.input="$TMP/p12.jsonl" --set job.output="$TMP/cfg.jsonl"
[ "$(wc -l <"$TMP/cfg.jsonl")" -eq 12 ] && pass "run: configs/pycode-cpu.ini wrote 12 lines" || fail "run: configs/pycode-cpu.ini"

# run: the scheduling members of a request; a bad one makes an error line naming it
# (with the line's own id), the others run
printf '%s\n' '{"id": "p", "prompt": "def f(x):", "priority": "x"}' '{"id": "s", "prompt": "def f(x):", "stop": [1]}' \
    '{"id": "t", "prompt": "def f(x):", "timeout_s": -1}' \
    '{"id": "ok", "prompt": "def f(x):", "priority": 3, "timeout_s": 60, "stop": ["\n\n\n"], "max_tokens": 2}' \
    >"$TMP/fields.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=fields.jsonl --set job.output=fields.out >/dev/null 2>"$TMP/err"
rc=$?
python3 - "$TMP/fields.out" "$rc" <<'EOF'
import json, sys
rows = {o["id"]: o for o in map(json.loads, open(sys.argv[1]))}
want = {"p": '"priority" must be an integer', "s": '"stop"[0] must be a string',
        "t": '"timeout_s" must be a number of seconds'}
ok = sys.argv[2] == "1" and sorted(rows) == ["ok", "p", "s", "t"]
for k, w in want.items():
    ok = ok and "fields.jsonl:" in rows[k].get("error", "") and w in rows[k]["error"]
o = rows.get("ok", {})
ok = ok and len(o.get("tokens", [])) <= 2 and all(isinstance(o.get(k), (int, float)) for k in
                                                  ("cached_tokens", "preemptions", "queue_ms"))
print(("ok   - " if ok else "FAIL - ") + "run: bad priority / stop / timeout_s are error lines naming the member; "
      "a good line runs (exit %s: %r)" % (sys.argv[2], rows))
sys.exit(0 if ok else 1)
EOF
[ $? -eq 0 ] && pass "run: per-request fields" || fail "run: per-request fields"
badcfg "stop not JSON" "bad.ini:7: [sampling] stop: 'abc' is not JSON" "$ok_head[sampling]\nstop = abc\n"
badcfg "stop [1]" "bad.ini:7: [sampling] stop: '[1]': stop[0] must be a string" "$ok_head[sampling]\nstop = [1]\n"
badcfg "priority" "bad.ini:7: [job] priority: '1.5' is not an integer" "$ok_head[job]\npriority = 1.5\n"
badcfg "timeout_s" "bad.ini:7: [job] timeout_s: '-1' is not a number of seconds in [0, 1e+09]" "$ok_head[job]\ntimeout_s = -1\n"
badcfg "a line over inih's limit" "bad.ini:7: line longer than 199 bytes" "$ok_head[job]\noutput = $(printf 'x%.0s' $(seq 250))\n"
grep '"ok"' "$TMP/fields.jsonl" >"$TMP/fields-ok.jsonl"
expect_exit 0 "run: stop, priority and timeout_s in the job file" "$TANDEM" run "$TMP/job.ini" \
    --set 'sampling.stop=["\n\n\n", "\u003b"]' --set job.priority=-2 --set job.timeout_s=120 \
    --set job.input=fields-ok.jsonl --set job.output=fields-ok.out

# merge: the shards' outputs joined are the unsharded output (as a set of lines, in
# what does not depend on the batch: id, text, tokens, finish reason, prompt tokens;
# the same members)
rm -f "$TMP/merged.jsonl"
expect_exit 0 "merge: two shards" "$TANDEM" merge "$TMP/merged.jsonl" "$TMP/s0.jsonl" "$TMP/s1.jsonl" --input "$TMP/p12.jsonl"
python3 - "$TMP/merged.jsonl" "$TMP/out.jsonl" <<'EOF'
import json, sys
def rows(path):
    out = []
    for line in open(path):
        o = json.loads(line)
        keep = {k: o[k] for k in ("id", "text", "tokens", "finish_reason", "prompt_tokens")}
        out.append(json.dumps([sorted(o), keep], sort_keys=True))
    return sorted(out)
a, b = rows(sys.argv[1]), rows(sys.argv[2])
ok = len(a) == 12 and a == b and len(set(json.loads(r)[1]["id"] for r in a)) == 12
print(("ok   - " if ok else "FAIL - ") + "merge of the shards = the unsharded output (%d and %d lines)" % (len(a), len(b)))
sys.exit(0 if ok else 1)
EOF
[ $? -eq 0 ] && pass "merge: the same lines" || fail "merge: the same lines"

# a job that streams: the scheduler fed continuously, each line written as its request
# completes; merge --sort puts the lines back in input order
ids_of() { sed -E 's/.*"id": ([0-9]+).*/\1/' "$1"; }
rm -f "$TMP/sorted.jsonl"
expect_exit 0 "merge --sort" "$TANDEM" merge "$TMP/sorted.jsonl" "$TMP/out.jsonl" --input "$TMP/p12.jsonl" --sort
[ "$(ids_of "$TMP/sorted.jsonl" | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 8 9 10 11 " ] && tokens <"$TMP/sorted.jsonl" |
    cmp -s - "$TMP/b1" && pass "merge --sort: the lines in input order, unchanged" ||
    fail "merge --sort: ids $(ids_of "$TMP/sorted.jsonl" | tr '\n' ' ')"
expect_exit 2 "merge --sort without --input" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/out.jsonl" --sort
expect_err "--sort needs --input" "merge --sort without --input"
# ids 0-5 long (512 tokens), 6-11 short (4): the short ones' lines are there while
# the long ones still run (the whole job fits one window of the former runner, which
# wrote all 12 lines at once)
python3 - "$TMP/p12.jsonl" >"$TMP/mixed.jsonl" <<'EOF'
import json, sys
for i, l in enumerate(open(sys.argv[1])):
    o = json.loads(l); o["max_tokens"] = 512 if i < 6 else 4; print(json.dumps(o))
EOF
rm -f "$TMP/prog.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=mixed.jsonl --set job.output=prog.jsonl >/dev/null 2>"$TMP/prog.err" &
pid=$!
seen=0
while kill -0 "$pid" 2>/dev/null; do
    [ -s "$TMP/prog.jsonl" ] && { seen=$(wc -l <"$TMP/prog.jsonl"); break; }
    sleep 0.02
done
running=0
kill -0 "$pid" 2>/dev/null && running=1
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && [ "$seen" -ge 1 ] && [ "$seen" -lt 12 ] && [ "$running" -eq 1 ] && [ "$(wc -l <"$TMP/prog.jsonl")" -eq 12 ] &&
    pass "run: lines are written as requests complete, before the job ends ($seen while running)" ||
    fail "run: progress: exit $rc, $seen lines seen while running ($running)"
# kill -9 mid-job (max_batch 2: completions spread out), then the rerun: every id once
rm -f "$TMP/k9.jsonl"
"$TANDEM" run "$TMP/job.ini" --set job.input=mixed.jsonl --set job.output=k9.jsonl --set engine.max_batch=2 \
    >/dev/null 2>/dev/null &
pid=$!
while kill -0 "$pid" 2>/dev/null && [ "$(cat "$TMP/k9.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.02; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
n_before=$(wc -l <"$TMP/k9.jsonl")
expect_exit 0 "run: the rerun after kill -9" "$TANDEM" run "$TMP/job.ini" --set job.input=mixed.jsonl --set job.output=k9.jsonl
[ "$n_before" -ge 3 ] && [ "$n_before" -lt 12 ] && grep -q "already done" "$TMP/err" &&
    [ "$(ids_of "$TMP/k9.jsonl" | sort -n | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 8 9 10 11 " ] &&
    pass "run: kill -9 mid-job ($n_before lines), the rerun completes, no id twice" ||
    fail "run: kill -9 then rerun: $n_before lines before, ids $(ids_of "$TMP/k9.jsonl" | tr '\n' ' '); $(tail -n 1 "$TMP/err")"
no_out() { # DESC: the failed merge left neither OUT nor OUT.tmp
    [ ! -e "$TMP/m.jsonl" ] && [ ! -e "$TMP/m.jsonl.tmp" ] && pass "$1: nothing written" || fail "$1: left a file"
}
expect_exit 1 "merge: a duplicate id" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/s0.jsonl" "$TMP/s1.jsonl" "$TMP/s0.jsonl"
expect_err "s0.jsonl:1: duplicate id" "merge: a duplicate id"
no_out "merge: a duplicate id"
n1=$(wc -l <"$TMP/s1.jsonl")
head -c -8 "$TMP/s1.jsonl" >"$TMP/cut1.jsonl"
expect_exit 1 "merge: a truncated line" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/s0.jsonl" "$TMP/cut1.jsonl"
expect_err "cut1.jsonl:$n1: truncated line" "merge: a truncated line"
no_out "merge: a truncated line"
{ head -n 1 "$TMP/s1.jsonl"; echo '{"text": "no id"}'; } >"$TMP/noid.jsonl"
expect_exit 1 "merge: a line without an id" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/noid.jsonl"
expect_err 'noid.jsonl:2: a line without an "id"' "merge: a line without an id"
{ head -n 1 "$TMP/s1.jsonl"; echo '{"id": 99, "text": '; } >"$TMP/mal.jsonl"
expect_exit 1 "merge: a malformed line" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/mal.jsonl"
expect_err "mal.jsonl:2: malformed line (invalid JSON" "merge: a malformed line"
expect_exit 1 "merge: a missing shard (--input)" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/s0.jsonl" --input "$TMP/p12.jsonl"
expect_err "of the 12 ids of $TMP/p12.jsonl" "merge: a missing shard"
no_out "merge: a missing shard"
expect_exit 1 "merge: an existing OUT" "$TANDEM" merge "$TMP/merged.jsonl" "$TMP/s0.jsonl"
expect_err "exists (give --force to replace it)" "merge: an existing OUT"
expect_exit 0 "merge --force" "$TANDEM" merge --force "$TMP/merged.jsonl" "$TMP/s1.jsonl"
[ "$(wc -l <"$TMP/merged.jsonl")" -eq "$n1" ] && pass "merge --force: replaced" || fail "merge --force: not replaced"
expect_exit 2 "merge: no input files" "$TANDEM" merge "$TMP/m.jsonl"

# run and merge: the input's ids, strict options, the output file (a regular file,
# locked for the run, written whole lines at a time, synced) under faults.  A small job:
# short prompts, the target alone, 2 tokens.
for i in $(seq 0 29); do printf '{"id": "q%d", "prompt": "def f%d(x):"}\n' "$i" "$i"; done >"$TMP/p30.jsonl"
head -n 2 "$TMP/p30.jsonl" >"$TMP/p2.jsonl"
cat >"$TMP/fault.ini" <<EOF
[model]
target = $TARGET
[engine]
threads = 2
max_batch = 5
[sampling]
max_tokens = 2
[job]
input = p30.jsonl
output = fault.jsonl
EOF
# lines_ok FILE WANT INPUT: FILE is empty or ends with a newline, every line is a JSON
# object without "error" whose id is one of INPUT's (default p30.jsonl), each once; WANT
# "all": every id there, "some": some but not all, "any": no more.
lines_ok() {
    python3 - "$1" "$2" "${3:-$TMP/p30.jsonl}" <<'EOF'
import json, sys
data = open(sys.argv[1], "rb").read()
want = [json.loads(l)["id"] for l in open(sys.argv[3])]
ok = data == b"" or data.endswith(b"\n")
ids = []
for l in data.splitlines():
    try:
        o = json.loads(l)
        ids.append(o["id"])
        ok = ok and "error" not in o
    except Exception:
        ok = False
ok = ok and len(ids) == len(set(ids)) and set(ids) <= set(want)
if sys.argv[2] == "all":
    ok = ok and len(ids) == len(want)
elif sys.argv[2] == "some":
    ok = ok and 0 < len(ids) < len(want)
sys.exit(0 if ok else 1)
EOF
}

# --shard I/N: digits only, 0 <= I < N
for v in 0/2x 1/2/3 " 0/2" +0/2 0/+2 -0/2 0x1/2 0/0 /2 0/ 1e0/2 99999999999999999999/2; do
    expect_exit 2 "run --shard '$v'" "$TANDEM" run "$TMP/fault.ini" --shard "$v"
    expect_err "--shard $v: expected I/N" "run --shard '$v'"
done
# --set: a value of any length (here a target path of 2,200 bytes: ./././.../model)
rm -f "$TMP/longset.jsonl"
expect_exit 0 "run --set with a value over 2,047 bytes" "$TANDEM" run "$TMP/fault.ini" --set job.input=p2.jsonl \
    --set "model.target=$(dirname "$TARGET")/$(printf './%.0s' $(seq 1100))$(basename "$TARGET")" --set job.output=longset.jsonl
lines_ok "$TMP/longset.jsonl" all "$TMP/p2.jsonl" && pass "run --set (long value): the job ran" || fail "run --set (long value)"
# top_p: the range applies to the float the library takes (1e-320 is 0 there; a
# subnormal float is a valid top_p)
rm -f "$TMP/tp.jsonl"
expect_exit 1 "run: top_p 1e-320" "$TANDEM" run "$TMP/fault.ini" --set sampling.top_p=1e-320 --set job.output=tp.jsonl
expect_err "--set: [sampling] top_p: '1e-320' is not a number in (0, 1] (it is 0 as a float)" "run: top_p 1e-320"
[ ! -e "$TMP/tp.jsonl" ] && pass "run: top_p 1e-320: refused before anything ran" || fail "run: top_p 1e-320 wrote $TMP/tp.jsonl"
expect_exit 0 "run: top_p 1e-40 (a subnormal float)" "$TANDEM" run "$TMP/fault.ini" --set sampling.top_p=1e-40 \
    --set sampling.temperature=1 --set job.input=p2.jsonl --set job.output=tp.jsonl
lines_ok "$TMP/tp.jsonl" all "$TMP/p2.jsonl" && pass "run: top_p 1e-40: every request ran" || fail "run: top_p 1e-40: $(head -c 300 "$TMP/tp.jsonl")"
expect_exit 2 "generate --top-p 1e-320" "$TANDEM" generate -m "$TARGET" -p x --top-p 1e-320
expect_exit 0 "generate --top-p 1e-40" "$TANDEM" generate -m "$TARGET" -p x -n 2 --temp 1 --top-p 1e-40

# duplicate input ids (a line without an id takes its 0-based index): refused before
# anything runs, naming both lines; merge --input the same
printf '%s\n' '{"prompt": "def a():"}' '{"id": "x", "prompt": "def b():"}' '{"id": 0, "prompt": "def c():"}' \
    '{"id": "x", "prompt": "def d():"}' '{"id": "0", "prompt": "def e():"}' >"$TMP/dup.jsonl"
rm -f "$TMP/dup.out"
expect_exit 1 "run: duplicate input ids" "$TANDEM" run "$TMP/fault.ini" --set job.input=dup.jsonl --set job.output=dup.out
expect_err "dup.jsonl:3: duplicate id 0 (first at $TMP/dup.jsonl:1;" "run: duplicate input ids"
expect_err "dup.jsonl:4: duplicate id \"x\" (first at $TMP/dup.jsonl:2)" "run: duplicate input ids"
[ "$(grep -c '^error: ' "$TMP/err")" -eq 2 ] && pass "run: duplicate input ids: 0 and \"0\" differ" || fail "run: duplicate ids: $(cat "$TMP/err")"
[ ! -e "$TMP/dup.out" ] && pass "run: duplicate input ids: nothing ran" || fail "run: duplicate input ids: wrote $TMP/dup.out"
expect_exit 1 "merge --input with duplicate ids" "$TANDEM" merge "$TMP/m.jsonl" "$TMP/s0.jsonl" --input "$TMP/dup.jsonl"
expect_err "dup.jsonl:3: duplicate id 0" "merge --input with duplicate ids"
no_out "merge --input with duplicate ids"

# outputs that are not regular files: refused before they are read or waited on
mkfifo "$TMP/fifo.jsonl"
mkdir "$TMP/dir.jsonl"
for o in /dev/zero "$TMP/fifo.jsonl" "$TMP/dir.jsonl"; do
    expect_exit 1 "run: output $o" timeout 20 "$TANDEM" run "$TMP/fault.ini" --set job.output="$o"
    expect_err "$o: not a regular file" "run: output $o"
done
expect_exit 1 "merge --force: OUT a FIFO" timeout 20 "$TANDEM" merge --force "$TMP/fifo.jsonl" "$TMP/s0.jsonl"
expect_err "fifo.jsonl: not a regular file" "merge --force: OUT a FIFO"
[ -p "$TMP/fifo.jsonl" ] && pass "merge --force: the FIFO is still there" || fail "merge --force: replaced the FIFO"
mkfifo "$TMP/m.jsonl.tmp"
expect_exit 1 "merge: OUT.tmp a FIFO" timeout 20 "$TANDEM" merge "$TMP/m.jsonl" "$TMP/s0.jsonl"
expect_err "m.jsonl.tmp: not a regular file" "merge: OUT.tmp a FIFO"
[ -p "$TMP/m.jsonl.tmp" ] && [ ! -e "$TMP/m.jsonl" ] && pass "merge: OUT.tmp a FIFO: left as it was" || fail "merge: OUT.tmp a FIFO"
rm -f "$TMP/m.jsonl.tmp"

# one runner per output: another's lock refuses the run at once (flock(1) holds it
# here), and two runners started together write every id once
: >"$TMP/lk.jsonl"
exec 9>>"$TMP/lk.jsonl"
if flock -n 9; then
    expect_exit 1 "run: the output locked by another process" timeout 20 "$TANDEM" run "$TMP/fault.ini" --set job.output=lk.jsonl
    expect_err "lk.jsonl: locked by another process" "run: a locked output"
    [ ! -s "$TMP/lk.jsonl" ] && pass "run: a locked output: nothing written" || fail "run: a locked output: written"
else
    skip "run: a locked output (flock(1) cannot lock $TMP/lk.jsonl)"
fi
exec 9>&-
rm -f "$TMP/two.jsonl"
"$TANDEM" run "$TMP/fault.ini" --set job.output=two.jsonl >/dev/null 2>"$TMP/two1.err" &
p1=$!
"$TANDEM" run "$TMP/fault.ini" --set job.output=two.jsonl >/dev/null 2>"$TMP/two2.err"
r2=$?
wait "$p1"
r1=$?
if lines_ok "$TMP/two.jsonl" all && { { [ $((r1 + r2)) -eq 1 ] && grep -q "two.jsonl: locked by another process" "$TMP/two$((r2 + 1)).err"; } ||
    { [ $((r1 + r2)) -eq 0 ] && grep -q "(30 already done" "$TMP/two1.err" "$TMP/two2.err"; }; }; then
    pass "run: two runners on one output: one refused (or the second found all done), every id once"
else
    fail "run: two runners: exit $r1 and $r2, $(cat "$TMP/two1.err" "$TMP/two2.err" | grep -v '^run: [0-9]' | head -c 400)"
fi

# a full disk and a read-only file system (a 64 KiB tmpfs): an error naming the file
# and the cause, exit 1, whole lines only; the rerun once there is room completes the
# job; merge leaves neither OUT.tmp nor a changed OUT
mkdir -p "$MNT"
if mount -t tmpfs -o size=64k tmpfs "$MNT" 2>"$TMP/mount.err"; then
    head -c 61440 /dev/zero >"$MNT/fill" # all but one 4 KiB page: about 16 of the 30 lines
    expect_error "run: a full disk" "$MNT/full.jsonl: cannot write: No space left on device" \
        "$TANDEM" run "$TMP/fault.ini" --set job.output="$MNT/full.jsonl"
    lines_ok "$MNT/full.jsonl" some && pass "run: a full disk: the lines that fit, whole" ||
        fail "run: a full disk: $(wc -l <"$MNT/full.jsonl") lines, $(tail -c 100 "$MNT/full.jsonl")"
    ! grep -q "errors)" "$TMP/err" && pass "run: a full disk: no summary claiming success" || fail "run: a full disk: $(cat "$TMP/err")"
    rm "$MNT/fill"
    expect_exit 0 "run: a full disk, the rerun" "$TANDEM" run "$TMP/fault.ini" --set job.output="$MNT/full.jsonl"
    lines_ok "$MNT/full.jsonl" all && grep -q "already done" "$TMP/err" && pass "run: the rerun completed the job" ||
        fail "run: the rerun: $(tail -n 1 "$TMP/err")"
    python3 - "$MNT/full.jsonl" "$TMP/two.jsonl" <<'EOF' && pass "run: the resumed job's tokens are a whole run's" || fail "run: the resumed job's tokens differ"
import json, sys
a, b = ({o["id"]: o["tokens"] for o in map(json.loads, open(f))} for f in sys.argv[1:3])
sys.exit(0 if a == b else 1)
EOF
    rm "$MNT/full.jsonl"
    printf '%s\n' '{"id": "old"}' >"$MNT/old.jsonl"
    head -c 61440 /dev/zero >"$MNT/fill" # (with old.jsonl's page: no room left)
    expect_error "merge: a full disk" "$MNT/m.jsonl.tmp: cannot write: No space left on device" \
        "$TANDEM" merge "$MNT/m.jsonl" "$TMP/two.jsonl"
    [ ! -e "$MNT/m.jsonl" ] && [ ! -e "$MNT/m.jsonl.tmp" ] && pass "merge: a full disk: nothing left" || fail "merge: a full disk left a file"
    expect_error "merge --force: a full disk" "cannot write: No space left on device" \
        "$TANDEM" merge --force "$MNT/old.jsonl" "$TMP/two.jsonl"
    [ "$(cat "$MNT/old.jsonl")" = '{"id": "old"}' ] && [ ! -e "$MNT/old.jsonl.tmp" ] &&
        pass "merge --force: a full disk: OUT as it was" || fail "merge --force: a full disk changed OUT"
    rm "$MNT/fill"
    { head -n 3 "$TMP/two.jsonl"; sed -n 4p "$TMP/two.jsonl" | head -c 20; } >"$MNT/ro.jsonl"
    cp "$MNT/ro.jsonl" "$TMP/ro.before"
    if mount -o remount,ro "$MNT"; then
        expect_error "run: a read-only file system" "$MNT/ro.jsonl: Read-only file system" \
            "$TANDEM" run "$TMP/fault.ini" --set job.output="$MNT/ro.jsonl"
        cmp -s "$MNT/ro.jsonl" "$TMP/ro.before" && pass "run: a read-only file system: the output as it was" ||
            fail "run: a read-only file system: the output changed"
        expect_error "run: a new output on a read-only file system" "$MNT/new.jsonl: Read-only file system" \
            "$TANDEM" run "$TMP/fault.ini" --set job.output="$MNT/new.jsonl"
        expect_error "merge: a read-only file system" "$MNT/m.jsonl.tmp: Read-only file system" \
            "$TANDEM" merge "$MNT/m.jsonl" "$TMP/two.jsonl"
        [ ! -e "$MNT/m.jsonl" ] && [ ! -e "$MNT/new.jsonl" ] && pass "merge, run: a read-only file system: nothing created" ||
            fail "a read-only file system: a file was created"
    else
        skip "the read-only file system cases (remount,ro failed)"
    fi
    umount "$MNT"
else
    skip "the full-disk and read-only cases (mount -t tmpfs: $(head -c 200 "$TMP/mount.err"))"
fi

cli_done
