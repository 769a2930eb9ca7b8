#!/usr/bin/env bash
# Session 48: the fixed-point deterministic DSA backward with 64-byte reduction requests
# (l64.tar.xz: cli64, t64) against main's partial-row mode (s48a.tar.xz: cli_main) and the merged
# 32-byte form (det.tar.xz: cli): the 64-byte build's deterministic suites and memcheck first,
# then the A/B alone on the GPU.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/d /tmp/l && tar -xJf .devcall/s48a.tar.xz -C /tmp/a && tar -xJf .devcall/det.tar.xz -C /tmp/d \
  && tar -xJf .devcall/l64.tar.xz -C /tmp/l
L=$OUT/log.txt
F='*FixedPoint*:Cases/Sm90DsaBackward.MatchesReference/*Det*'
(timeout 150 /tmp/l/bins/t64 --gtest_brief=1 --gtest_filter="$F" > $OUT/t64.log 2>&1; echo "t64 rc=$?" >> $OUT/t64.log) &
(timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/l/bins/t64 --gtest_brief=1 \
   --gtest_filter='Sm90DsaBackwardFixedPoint.NaN*' > $OUT/mc.log 2>&1; echo "memcheck rc=$?" >> $OUT/mc.log) &
wait
grep -E "PASSED|FAILED|rc=" $OUT/t64.log | tee -a $L; grep -E "ERROR SUMMARY|rc=" $OUT/mc.log | tee -a $L
S="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-dqk 576"
OUT=$OUT/ab SHAPES="$S --dsa-heads 64;$S --dsa-heads 128" PASSES=2 ROUNDS=3 VARIANT='impl=sm90,deterministic=1' \
  scripts/ab_bins.sh main=/tmp/a/bins/cli_main fix32=/tmp/d/bins/cli fix64=/tmp/l/bins/cli64 | tee -a $L
