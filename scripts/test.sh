#!/usr/bin/env bash
# Sets up, checks the include graph against the layers (scripts/layers.py, counted as
# one test), builds and runs the whole test suite twice: a normal (release) build and
# an AddressSanitizer + UndefinedBehaviorSanitizer build; the concurrency cases in a
# ThreadSanitizer build; then every fuzz harness for
# 15 s (scripts/fuzz.sh, counted as one test).  Tests run one per core, those of
# suite 'threaded' (engines of two threads) one per two cores in a run of their own
# (meson --num-processes; tests that measure time run alone).  Prints each test's
# time, reports (does not fail) any test over its budget and the whole command's
# wall time against its budget, and closes with one line
# "tests: N passed, N failed, N skipped"; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
# Each phase's wall time and CPU time (user + sys of the commands it ran, from this
# shell's /proc stat: its finished children), printed as a table at the end; CPU
# time is the measure on a shared machine, where wall time depends on the load.
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
phase_rows=()
phase_wall0=$t_start phase_cpu0=0
cpu_ticks() { # user + sys ticks of this shell's waited-for children
  local st; read -r st </proc/$$/stat; st=${st##*) }
  local f; read -ra f <<<"$st"
  echo $((f[13] + f[14]))
}
phase_end() { # NAME: closes the phase that started at the previous phase_end
  local now cpu; now=$(date +%s); cpu=$(cpu_ticks)
  phase_rows+=("$(printf '%-14s %6d %7d' "$1" $((now - phase_wall0)) $(((cpu - phase_cpu0) / clk_tck)))")
  phase_wall0=$now phase_cpu0=$cpu
}
./scripts/setup.sh || exit 1
phase_end setup
jobs=$(nproc 2>/dev/null || echo 2)
passed=0 failed=0 skipped=0 status=0
# Budgets (seconds) on the 2-core project machine: one test, per build; the whole
# command (CI stops at 90 minutes; keep well inside).
BUDGET_TEST_normal=300
BUDGET_TEST_asan=600
BUDGET_TOTAL=1800
slow=()

# Per-test durations from meson's JSON test logs (both runs of run_tests), slowest
# first; tests over the budget are collected in `slow`.
report_times() {
  local name=$1 dir=$2 budget=$3 line
  while IFS= read -r line; do
    echo "  $line"
    case "$line" in *" SLOW"*) slow+=("$name: $line") ;; esac
  done < <(python3 - "$budget" "$dir/meson-logs/testlog-threaded.json" "$dir/meson-logs/testlog-shared.json" <<'PY'
import json, os, sys
rows = []
for path in sys.argv[2:]:
    if not os.path.exists(path):
        continue
    for l in open(path):
        l = l.strip()
        if l:
            t = json.loads(l)
            rows.append((t.get("duration", 0.0), t["name"], t.get("result", "")))
for d, n, r in sorted(rows, reverse=True):
    flag = "  SLOW (budget %s s)" % sys.argv[1] if d > float(sys.argv[1]) else ""
    print("%-18s %-8s %8.1f s%s" % (n, r, d, flag))
PY
)
}

# meson test on dir with ARGS..., adding its counts to the tally; LOGBASE names its
# JSON log (meson-logs/LOGBASE.json).  Returns meson's status.
run_tests() {
  local dir=$1 logbase=$2; shift 2
  local log rc ok fail skip tmo
  log=$(mktemp)
  meson test -C "$dir" --no-rebuild --print-errorlogs --logbase "$logbase" "$@" | tee "$log"
  rc=${PIPESTATUS[0]}
  ok=$(awk '/^Ok:/ {print $2}' "$log"); fail=$(awk '/^Fail:/ {print $2}' "$log")
  skip=$(awk '/^Skipped:/ {print $2}' "$log"); tmo=$(awk '/^Timeout:/ {print $2}' "$log")
  passed=$((passed + ${ok:-0})); failed=$((failed + ${fail:-0} + ${tmo:-0})); skipped=$((skipped + ${skip:-0}))
  rm -f "$log"
  return "$rc"
}

run_suite() {
  local name=$1 dir=$2; shift 2
  local mult=1
  [ "$name" = asan ] && mult=6
  echo "== $name build =="
  if [ -d "$dir" ]; then meson setup --reconfigure "$dir" "$@" >/dev/null; else meson setup "$dir" "$@" >/dev/null; fi || return 1
  meson compile -C "$dir" -j "$jobs" || { phase_end "$name build"; return 1; }
  phase_end "$name build"
  local t0 rc=0; t0=$(date +%s)
  # The tests of suite 'threaded' (engines of two threads or more) one per two cores:
  # two of them on two cores wait on each other's thread-pool barriers
  # (tests/meson.build); then the others one per core.
  local tjobs=$((jobs / 2 > 0 ? jobs / 2 : 1))
  rm -f "$dir"/meson-logs/testlog-{threaded,shared}.json
  run_tests "$dir" testlog-threaded --suite threaded --num-processes "$tjobs" --timeout-multiplier "$mult" || rc=1
  run_tests "$dir" testlog-shared --no-suite threaded --num-processes "$jobs" --timeout-multiplier "$mult" || rc=1
  phase_end "$name tests"
  local budget_var="BUDGET_TEST_$name"
  echo "== $name build: test times ($(( $(date +%s) - t0 )) s of tests; threaded ones $tjobs at a time, the others $jobs) =="
  report_times "$name" "$dir" "${!budget_var}"
  return "$rc"
}

# The include graph against the layers (scripts/layers.py; python3 alone): one test
# of the tally.
echo "== layers: the include graph (scripts/layers.py) =="
if python3 scripts/layers.py; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)) status=1
fi
phase_end layers

run_suite normal build || status=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# (without the CUDA kernels: nothing here runs them, and the normal build already
# compiles them; the CUDA tests report themselves skipped in both builds here)
run_suite asan build-asan -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false \
    -Dcuda=disabled || status=1
# ThreadSanitizer: the concurrency cases (tests/concurrency_cases.c: one engine from
# many threads) as a plain program, since Criterion cannot start under it; only the
# library and that program are built.  Its closing line "concurrency: N passed, N
# failed" joins the tally; a ThreadSanitizer report fails it (exit 66).
echo "== tsan build: tests/tsan_concurrency =="
tsan_log=$(mktemp)
if { [ -d build-tsan ] || meson setup build-tsan -Db_sanitize=thread -Dbuildtype=debugoptimized -Db_lundef=false \
       -Dcuda=disabled -Dhttp=disabled >/dev/null; } && meson compile -C build-tsan -j "$jobs" tests/tsan_concurrency; then
  TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1 ./build-tsan/tests/tsan_concurrency models 2>&1 | tee "$tsan_log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '^concurrency: [0-9]+ passed, [0-9]+ failed' "$tsan_log" | tail -1)
  p=$(echo "$line" | awk '{print $2}'); f=$(echo "$line" | awk '{print $4}')
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
  if [ "$rc" -ne 0 ]; then
    status=1
    [ "${f:-0}" -eq 0 ] && failed=$((failed + 1))   # a ThreadSanitizer report or a crash
  fi
else
  status=1
fi
rm -f "$tsan_log"
phase_end tsan
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1   # a build step failed
# The libFuzzer harnesses (tests/fuzz/), briefly: one test of the tally (skipped where
# clang has no libFuzzer).
echo "== fuzz: every harness of tests/fuzz for 15 s =="
./scripts/fuzz.sh 15
case $? in
0) passed=$((passed + 1)) ;;
77) skipped=$((skipped + 1)) ;;
*) failed=$((failed + 1)) status=1 ;;
esac
phase_end fuzz
wall=$(( $(date +%s) - t_start ))
echo "== phases: wall s, CPU s (user + sys) =="
for r in "${phase_rows[@]}"; do echo "  $r"; done
for s in "${slow[@]}"; do echo "slow test (reported, not failed): $s"; done
over=""
[ "$wall" -gt "$BUDGET_TOTAL" ] && over="  OVER BUDGET (reported, not failed)"
printf 'total wall time: %d min %02d s (budget %d min)%s\n' $((wall / 60)) $((wall % 60)) $((BUDGET_TOTAL / 60)) "$over"
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit "$status"
