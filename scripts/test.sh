#!/usr/bin/env bash
# The test command: set-up, build, then every registered test (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
