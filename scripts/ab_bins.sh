#!/usr/bin/env bash
# A/B of several builds in one device call (docs/performance.md: same machine, runs alternating):
# for each shape and pass, `sparse-attention bench` runs once per build, in turn. The CLI links
# the library statically, so a build is one self-contained binary (copy build/sparse-attention
# aside before a change).
#
#   scripts/ab_bins.sh LABEL=CLI[,VAR=VALUE...] ...   (CLI: a sparse-attention binary; the
#                                                      assignments are set for its runs)
# Environment:
#   SHAPES   ';'-separated bench argument lists (default: the Hopper BSA forward and backward at
#            the headline shape, block 128 and 64, 50%, and block 128 at 12.5%)
#   PASSES   passes over all shapes (default 2)
#   ROUNDS   --rounds per run (default 3)
#   VARIANT  the bench variant timed (default impl=sm90)
# Output: $OUT/ab.log (every run) and one line per run on stdout (median TFLOPS).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/sa_ab_out}"
mkdir -p "$OUT"
VARIANT="${VARIANT:-impl=sm90}"
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
DEFAULT_SHAPES="--op bsa_fwd $H --block 128 --density 0.5;--op bsa_fwd $H --block 64 --density 0.5"
DEFAULT_SHAPES+=";--op bsa_fwd $H --block 128 --density 0.125;--op bsa_bwd $H --block 128 --density 0.5"
DEFAULT_SHAPES+=";--op bsa_bwd $H --block 64 --density 0.5"
SHAPES="${SHAPES:-$DEFAULT_SHAPES}"
PASSES="${PASSES:-2}"
ROUNDS="${ROUNDS:-3}"
[ $# -ge 1 ] || { echo "usage: $0 LABEL=CLI [LABEL=CLI ...]" >&2; exit 2; }
: > "$OUT/ab.log"
IFS=';' read -r -a shape_list <<< "$SHAPES"
status=0
for ((pass = 1; pass <= PASSES; ++pass)); do
  for shape in "${shape_list[@]}"; do
    for spec in "$@"; do
      label=${spec%%=*}; bin=${spec#*=}
      # CLI,VAR=VALUE,...: environment assignments for this build's runs.
      IFS=',' read -r -a knobs <<< "$bin"
      bin=${knobs[0]}
      # shellcheck disable=SC2086  # the shape is a list of arguments
      out=$(env "${knobs[@]:1}" timeout 120 "$bin" bench $shape --variants "$VARIANT" \
              --rounds "$ROUNDS" 2>&1) || status=1
      tflops=$(printf '%s\n' "$out" | awk -v v="$VARIANT" '$1 == v {print $5}' | tail -1)
      echo "pass $pass | $label | ${tflops:-FAILED} TFLOPS | $shape" | tee -a "$OUT/ab.log"
      printf '%s\n' "$out" >> "$OUT/ab.log"
    done
  done
done
exit $status
