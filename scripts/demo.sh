#!/usr/bin/env bash
# The main job: BSA and DSA forward and backward on a default problem, with a correctness summary.
# Builds first (scripts/build.sh), then runs `sparse-attention demo` with the arguments given
# (see --help). A first argument naming another command of the CLI runs that command instead:
#   ./scripts/demo.sh bench --op bsa_bwd --variants "impl=portable/impl=sm90"
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >&2
case "${1:-}" in
  demo | bench | help) exec ./build/sparse-attention "$@" ;;
  *) exec ./build/sparse-attention demo "$@" ;;
esac
