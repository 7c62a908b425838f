#!/usr/bin/env bash
# Installs the build and test dependencies (Debian 12) when they are missing.
set -euo pipefail
need=()
command -v meson >/dev/null 2>&1 || need+=(meson)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v clang >/dev/null 2>&1 || need+=(clang libclang-rt-dev) # scripts/fuzz.sh (libFuzzer)
pkg-config --exists inih 2>/dev/null || need+=(libinih-dev)
pkg-config --exists criterion 2>/dev/null || need+=(libcriterion-dev)
pkg-config --exists libmicrohttpd 2>/dev/null || need+=(libmicrohttpd-dev) # tandem serve's HTTP server
pkg-config --exists libedit 2>/dev/null || need+=(libedit-dev) # tandem chat's line editing
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light) # tests/test_serve_nginx.py
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv) # tests/test_serve.sh (openai)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
