# cli_testlib.sh - what the command-line tests share (sourced by tests/test_cli.sh
# and tests/test_cli_jobs.sh, with the tandem binary as $1): the models and data, a
# scratch folder (and a mount point for the tmpfs cases) removed at exit, the tally
# (pass / fail / skip, closed by cli_done), and the exit-status and stderr checks.
set -u

TANDEM=${1:?usage: $0 path/to/tandem}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${TDM_MODELS:-$HERE/../models}
DATA=${TDM_TEST_DATA:-$HERE/data}
TARGET=$MODELS/pycode-target-f16.gguf
DRAFT=$MODELS/pycode-draft-s-f16.gguf
export TANDEM TARGET DRAFT DATA

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-cli-test.XXXXXX")
MNT=$TMP/mnt # a small tmpfs for the full-disk and read-only cases (mounted there when root)
trap 'mountpoint -q "$MNT" 2>/dev/null && umount "$MNT"; rm -rf "$TMP"' EXIT

n_fail=0
n_pass=0
n_skip=0
pass() { n_pass=$((n_pass + 1)); echo "ok   - $1"; }
fail() { n_fail=$((n_fail + 1)); echo "FAIL - $1"; }
skip() { n_skip=$((n_skip + 1)); echo "skip - $1"; }

# expect_exit CODE DESCRIPTION CMD... : runs CMD (stdin: $STDIN, default /dev/null),
# checks its exit status and, for a non-zero CODE, that stderr starts with "error:"
# and stdout stays empty.
expect_exit() {
    local want=$1 desc=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err" <"${STDIN:-/dev/null}"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        fail "$desc: exit $got, expected $want (stderr: $(head -c 300 "$TMP/err"))"
        return
    fi
    if [ "$want" -ne 0 ]; then
        if ! head -n 1 "$TMP/err" | grep -q '^error: '; then
            fail "$desc: stderr does not start with 'error: ' ($(head -c 200 "$TMP/err"))"
            return
        fi
        if [ -s "$TMP/out" ]; then
            fail "$desc: unexpected output on stdout"
            return
        fi
        # a usage error: the error, then one line pointing to the command's --help
        # (not the help itself, which would scroll the error away)
        if [ "$want" -eq 2 ] && ! tail -n 1 "$TMP/err" | grep -q "^see 'tandem .*--help'"; then
            fail "$desc: the line pointing to --help is not the last of stderr ($(tail -n 2 "$TMP/err"))"
            return
        fi
        if [ "$want" -eq 2 ] && grep -q '^usage:' "$TMP/err"; then
            fail "$desc: the help text is printed with the error"
            return
        fi
    fi
    pass "$desc"
}

# expect_err TEXT DESCRIPTION: the last command's stderr contains TEXT.
expect_err() {
    if grep -qF -- "$1" "$TMP/err"; then
        pass "$2: names '$1'"
    else
        fail "$2: stderr does not contain '$1' ($(head -c 300 "$TMP/err"))"
    fi
}

# one_line_err DESCRIPTION: the last command's stderr is one line, ending in a newline
# (an error printed once).
one_line_err() {
    [ "$(wc -l <"$TMP/err")" -eq 1 ] && [ "$(tail -c 1 "$TMP/err" | od -An -c | tr -d ' ')" = '\n' ] &&
        pass "$1: the error once, on one line" || fail "$1: $(cat "$TMP/err")"
}

# expect_error DESCRIPTION TEXT CMD...: CMD exits 1 with an "error: " line holding TEXT
# on stderr (progress lines may come before it).
expect_error() {
    local desc=$1 text=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local got=$?
    if [ "$got" -ne 1 ]; then
        fail "$desc: exit $got, expected 1 (stderr: $(tail -c 300 "$TMP/err"))"
    elif ! grep '^error: ' "$TMP/err" | grep -qF -- "$text"; then
        fail "$desc: no error line with '$text' ($(tail -c 300 "$TMP/err"))"
    else
        pass "$desc"
    fi
}

for f in "$TANDEM" "$TARGET" "$DRAFT" "$DATA/tokenizer-cases.jsonl" "$DATA/prompts-dev.jsonl"; do
    if [ ! -e "$f" ]; then
        echo "FAIL - missing $f"
        exit 1
    fi
done
command -v python3 >/dev/null || { echo "FAIL - python3 not found"; exit 1; }

# tokens: "ID [TOKENS]" of each `generate --json` line on stdin.
tokens() { sed -E 's/.*"id": ([0-9]+).*"tokens": (\[[^]]*\]).*/\1 \2/'; }

# cli_done: the closing tally line; the exit status (0 when no check failed).
cli_done() {
    echo "# $n_pass passed, $n_fail failed, $n_skip skipped"
    [ "$n_fail" -eq 0 ]
}

