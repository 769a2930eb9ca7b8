#!/usr/bin/env bash
# The GPU run: one device call runs the whole GPU suite, the sanitizers and the benchmarks over a
# build/ folder made on the development machine (carried to the device with the working tree).
#
#   scripts/gpu_suite.sh [tests] [sanitize] [python] [bench] [anchors]     (default: all)
#
# Logs and results go to $OUT (the device tool's output folder; /tmp/sa_gpu_out elsewhere).
# Environment: BENCH_OPS (default "bsa_fwd bsa_bwd dsa_fwd dsa_bwd"), BENCH_QUICK=1 (one shape
# per op), SAN_FILTER (gtest filter for the sanitizer runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/sa_gpu_out}"
mkdir -p "$OUT"
STEPS="${*:-tests sanitize python bench anchors}"
BIN=./build
status=0
note() { echo "== $* ($(date +%H:%M:%S))"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv > "$OUT/gpu.txt" 2>&1 || true

if [[ " $STEPS " == *" tests "* ]]; then
  note "GoogleTest suite (CPU and GPU tests)"
  "$BIN/sa_tests" --gtest_brief=1 > "$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|SKIPPED \]|tests ran" "$OUT/gpu_tests.log" | tail -25
fi

if [[ " $STEPS " == *" sanitize "* ]]; then
  SAN_FILTER="${SAN_FILTER:-Gpu*:*Gpu*}"
  for tool in memcheck racecheck; do
    note "compute-sanitizer $tool on $SAN_FILTER"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN/sa_tests" --gtest_brief=1 \
      --gtest_filter="$SAN_FILTER" > "$OUT/sanitizer_$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED|PASSED" "$OUT/sanitizer_$tool.log" | tail -5
  done
fi

if [[ " $STEPS " == *" python "* ]]; then
  # The package from the source tree over the carried library (the device has no network to
  # build a wheel); PY_TESTS narrows it (default: the CUDA tests).
  note "python package tests on CUDA"
  SPARSE_ATTENTION_LIBRARY="$PWD/$BIN/libsparse_attention.so" PYTHONPATH="$PWD/python" \
    python3 -m pytest ${PY_TESTS:-python/tests/test_cuda.py} -q -p no:cacheprovider \
    > "$OUT/python_tests.log" 2>&1 || status=1
  tail -8 "$OUT/python_tests.log"
fi

if [[ " $STEPS " == *" bench "* ]]; then
  note "sparse-attention bench"
  OPS="${BENCH_OPS:-bsa_fwd bsa_bwd dsa_fwd dsa_bwd}"
  J="$OUT/bench_ours.json"
  run() { "$BIN/sparse-attention" bench "$@" --json "$J" >> "$OUT/bench.log" 2>&1 || status=1; }
  for op in $OPS; do
    case $op in
      bsa_*)
        for block in 128 64; do
          for density in 0.5 0.25 0.125; do
            run --op "$op" --batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128 \
              --block "$block" --density "$density" ${BSA_VARIANTS:+--variants "$BSA_VARIANTS"}
            [ "${BENCH_QUICK:-0}" = 1 ] && break 2
          done
        done ;;
      dsa_*)
        for h in 128 64; do
          for dqk in 576 512; do
            run --op "$op" --dsa-heads "$h" --dsa-dqk "$dqk" --dsa-seq 4096 --topk 2048 \
              --topk-length off --sink on
            [ "${BENCH_QUICK:-0}" = 1 ] && break 2
          done
        done ;;
    esac
  done
  grep -E "^\[|^  [a-z]" "$OUT/bench.log" | tail -60
fi

if [[ " $STEPS " == *" anchors "* ]] && [ -f bench/anchors.py ]; then
  note "anchors (python, same process as our library)"
  PYTHONUNBUFFERED=1 python3 bench/anchors.py --lib "$BIN/libsparse_attention.so" ${ANCHORS_ARGS:-} \
    --out "$OUT" > "$OUT/anchors.log" 2>&1 || status=1
  tail -40 "$OUT/anchors.log"
fi
note "done, status $status"
exit $status
