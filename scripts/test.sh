#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite twice: a normal (release) build and
# an AddressSanitizer + UndefinedBehaviorSanitizer build.  Prints one closing line
# "tests: N passed, N failed, N skipped" and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
jobs=$(nproc 2>/dev/null || echo 2)
passed=0 failed=0 skipped=0 status=0

run_suite() {
  local name=$1 dir=$2; shift 2
  local mult=1
  [ "$name" = asan ] && mult=6
  echo "== $name build =="
  if [ -d "$dir" ]; then meson setup --reconfigure "$dir" "$@" >/dev/null; else meson setup "$dir" "$@" >/dev/null; fi || return 1
  meson compile -C "$dir" -j "$jobs" || return 1
  local log; log=$(mktemp)
  meson test -C "$dir" --print-errorlogs --num-processes 1 --timeout-multiplier "$mult" | tee "$log"
  local rc=${PIPESTATUS[0]}
  local ok fail skip tmo
  ok=$(awk '/^Ok:/ {print $2}' "$log"); fail=$(awk '/^Fail:/ {print $2}' "$log")
  skip=$(awk '/^Skipped:/ {print $2}' "$log"); tmo=$(awk '/^Timeout:/ {print $2}' "$log")
  passed=$((passed + ${ok:-0})); failed=$((failed + ${fail:-0} + ${tmo:-0})); skipped=$((skipped + ${skip:-0}))
  rm -f "$log"
  return "$rc"
}

run_suite normal build || status=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_suite asan build-asan -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false || status=1
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1   # a build step failed
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit "$status"
