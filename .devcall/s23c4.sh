#!/usr/bin/env bash
# Session 23, call 4: the landing run of main (early S and the moved waits).
cd "$(dirname "$0")/.."
tar xJf build-ref/carry.tar.xz
BENCH_FULL=1 timeout 575 bash scripts/gpu_suite.sh
