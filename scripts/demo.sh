#!/usr/bin/env bash
# The main job: BSA and DSA forward and backward on a default problem, with a correctness summary.
# Extra arguments go to `sparse-attention demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >&2
exec ./build/sparse-attention demo "$@"
