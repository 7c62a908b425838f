#!/usr/bin/env bash
# test_serve.sh - runs a `tandem serve` test driver (Python) with the interpreter it needs.
#
# usage: tests/test_serve.sh TANDEM VENV_DIR full|reduced SCRIPT.py
#
# Exit 77 (skipped) when tandem was built without HTTP support.  test_serve.py wants
# the `openai` package: it is installed once into VENV_DIR (a virtual environment in
# the build directory, made with python3 -m venv and pip); when that cannot be done
# (no network, no venv module) the driver runs without it and exits 77 after its
# other checks pass.  Drivers that need only the standard library use python3 as is.
set -u
TANDEM=${1:?usage: test_serve.sh TANDEM VENV_DIR full|reduced SCRIPT.py}
VENV=${2:?}
MODE=${3:?}
SCRIPT=${4:?}

if "$TANDEM" serve -m /nonexistent --port 0 2>&1 | grep -q "without HTTP support"; then
    echo "skipped: tandem was built without HTTP support (libmicrohttpd-dev missing at configure time)"
    exit 77
fi

PY=python3
if grep -qE "^[[:space:]]*import openai" "$SCRIPT"; then
    (
        flock 9 # (the release and sanitizer builds have venvs of their own; tests in one build share it)
        if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
            echo "test_serve: installing the openai package into $VENV" >&2
            rm -rf "$VENV"
            python3 -m venv "$VENV" &&
                timeout 300 "$VENV/bin/pip" install --disable-pip-version-check -q openai >"$VENV.log" 2>&1 ||
                { echo "test_serve: could not install openai (see $VENV.log); its checks are skipped" >&2; rm -rf "$VENV"; }
        fi
    ) 9>"$VENV.lock"
    [ -x "$VENV/bin/python" ] && PY=$VENV/bin/python
fi
exec "$PY" "$SCRIPT" "$TANDEM" "$MODE"
