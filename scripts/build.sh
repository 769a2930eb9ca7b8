#!/usr/bin/env bash
# Configure and build (Release) into build/. Runs the set-up step first; safe to re-run.
# The full compiler output, with the ptxas resource report of every kernel (registers, shared
# memory, spills), is kept in build/build.log; the console shows the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
rc=0
ninja -C build -j "$JOBS" >build/build.log 2>&1 || rc=$?
grep -v -E "^ptxas info|bytes stack frame|^\[[0-9]+/[0-9]+\]" build/build.log || true
if [ "$rc" -ne 0 ]; then echo "[build] failed (exit $rc); full log in build/build.log" >&2; fi
exit "$rc"
