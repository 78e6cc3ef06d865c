#!/usr/bin/env bash
# Create .venv and install llmtap with the given extras (default: model,test,export), on a fresh machine.
#
# With the test extra, the viewer's browser tests need Debian's Chromium at /usr/bin/chromium;
# it is installed with apt when missing and this runs as root (Playwright never downloads one).
#
# llama-cpp-python compiles llama.cpp with -march=native. Some virtual machines advertise Intel
# AMX (tile) instructions they cannot execute, and the server then dies with SIGILL on its first
# request; building without AMX avoids that and keeps AVX-512/AVX2. Build flags are not part of
# pip's wheel-cache key, so a wheel cached from a native build is removed once, here.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-model,test,export}"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
marker="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/llmtap/llama-wheel-no-amx"
if [ ! -f "$marker" ]; then
  .venv/bin/pip cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
fi
CFLAGS="$no_amx" CXXFLAGS="$no_amx" .venv/bin/pip install --quiet -e ".[${extras}]"
mkdir -p "$(dirname "$marker")" && touch "$marker"
if [[ ",${extras}," == *",test,"* ]] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
  else
    echo "bootstrap: /usr/bin/chromium is missing (apt-get install chromium as root); the browser tests will be skipped." >&2
  fi
fi
