#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite twice: a normal (release) build and
# an AddressSanitizer + UndefinedBehaviorSanitizer build.  Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)

run_suite() {
  local dir=$1; shift
  if [ ! -d "$dir" ]; then meson setup "$dir" "$@" >/dev/null; else meson setup --reconfigure "$dir" "$@" >/dev/null; fi
  meson compile -C "$dir" -j "$jobs"
  meson test -C "$dir" --print-errorlogs --num-processes 1 "${TEST_ARGS[@]}"
}

TEST_ARGS=()
echo "== normal build =="
run_suite build
echo "== ASan + UBSan build =="
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TEST_ARGS=(--timeout-multiplier 4)
run_suite build-asan -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false
echo "all test suites passed"
