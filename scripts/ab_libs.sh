#!/usr/bin/env bash
# A/B of several builds of the library in one device call (BENCHMARKING.md: same process kind,
# rounds alternating): for each shape and pass, `sparse-attention bench` runs once per library,
# in turn, with LD_LIBRARY_PATH pointing at that library's folder (the binaries' RUNPATH is
# $ORIGIN, so the variable wins).
#
#   scripts/ab_libs.sh LABEL=DIR[,VAR=VALUE...] ...   (DIR holds a libsparse_attention.so;
#                                                      "build" is the tree's own build; the
#                                                      assignments are set for DIR's runs)
# Environment:
#   SHAPES   ';'-separated bench argument lists (default: the Hopper BSA forward and backward at
#            the headline shape, block 128 and 64, 50%, and block 128 at 12.5%)
#   PASSES   passes over all shapes (default 2)
#   ROUNDS   --rounds per run (default 3)
#   BIN      the bench binary (default ./build/sparse-attention)
# Output: $OUT/ab.log (every run) and a summary table on stdout (median TFLOPS per library and
# shape, each pass).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/sa_ab_out}"
mkdir -p "$OUT"
BIN="${BIN:-./build/sparse-attention}"
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
DEFAULT_SHAPES="--op bsa_fwd $H --block 128 --density 0.5;--op bsa_fwd $H --block 64 --density 0.5"
DEFAULT_SHAPES+=";--op bsa_fwd $H --block 128 --density 0.125;--op bsa_bwd $H --block 128 --density 0.5"
DEFAULT_SHAPES+=";--op bsa_bwd $H --block 64 --density 0.5"
SHAPES="${SHAPES:-$DEFAULT_SHAPES}"
PASSES="${PASSES:-2}"
ROUNDS="${ROUNDS:-3}"
[ $# -ge 1 ] || { echo "usage: $0 LABEL=DIR [LABEL=DIR ...]" >&2; exit 2; }
: > "$OUT/ab.log"
IFS=';' read -r -a shape_list <<< "$SHAPES"
status=0
for ((pass = 1; pass <= PASSES; ++pass)); do
  for shape in "${shape_list[@]}"; do
    for spec in "$@"; do
      label=${spec%%=*}; dir=${spec#*=}
      # DIR,VAR=VALUE,...: environment assignments for this library's runs (experiment knobs).
      IFS=',' read -r -a knobs <<< "$dir"
      dir=${knobs[0]}
      # shellcheck disable=SC2086  # the shape is a list of arguments
      out=$(env "${knobs[@]:1}" LD_LIBRARY_PATH="$PWD/$dir" timeout 120 "$BIN" bench $shape \
              --variants impl=sm90 --rounds "$ROUNDS" 2>&1) || status=1
      tflops=$(printf '%s\n' "$out" | awk '$1 == "impl=sm90" {print $5}' | tail -1)
      echo "pass $pass | $label | ${tflops:-FAILED} TFLOPS | $shape" | tee -a "$OUT/ab.log"
      printf '%s\n' "$out" >> "$OUT/ab.log"
    done
  done
done
exit $status
