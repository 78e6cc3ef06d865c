#!/usr/bin/env bash
# Create .venv and install llmtap with the given extras (default: model,test,export), on a fresh machine.
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
