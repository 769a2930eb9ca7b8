#!/usr/bin/env bash
# Builds the CLI with FlashMLA's Hopper sparse prefill as a bench anchor (tools/flashmla_anchor.hpp):
#
#   scripts/flashmla_anchor.sh FLASHMLA_DIR [BUILD_DIR (build)]
#
# FLASHMLA_DIR: a FlashMLA source tree (git clone https://github.com/deepseek-ai/FlashMLA; tested
# at 9241ae3). Only its csrc/ is used, with our CUTLASS (its cutlass submodule is not needed).
# Then `sparse-attention bench --op dsa_fwd --variants "anchor=flashmla/impl=sm90"` times both on
# the same tensors, and scripts/gpu_suite.sh adds those rows when the carried CLI has the anchor.
set -euo pipefail
cd "$(dirname "$0")/.."
FM="$(cd "${1:?usage: scripts/flashmla_anchor.sh FLASHMLA_DIR [BUILD_DIR]}" && pwd)"
BUILD="${2:-build}"
[ -f "$FM/csrc/sm90/prefill/sparse/fwd.cu" ] || { echo "no csrc/sm90/prefill/sparse/fwd.cu in $FM" >&2; exit 2; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSA_FLASHMLA_DIR="$FM" > /dev/null
cmake --build "$BUILD" --target sparse-attention
"$BUILD/sparse-attention" help | grep "built in"
