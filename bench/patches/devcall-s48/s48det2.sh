#!/usr/bin/env bash
# Session 48, call 2 of the fixed-point deterministic mode: an A/B of main's partial-row Hopper
# deterministic mode (s48a.tar.xz cli_main) against the fixed-point one (det.tar.xz cli), and
# synccheck on main's tests binary (t_v4: main's DSA backward) to see whether the producer's
# "missing wait" is older than the change.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/d && tar -xJf .devcall/s48a.tar.xz -C /tmp/a && tar -xJf .devcall/det.tar.xz -C /tmp/d
L=$OUT/log.txt
S="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-dqk 576"
OUT=$OUT/ab SHAPES="$S --dsa-heads 64;$S --dsa-heads 128" PASSES=2 ROUNDS=3 VARIANT='impl=sm90,deterministic=1' \
  scripts/ab_bins.sh main=/tmp/a/bins/cli_main fix=/tmp/d/bins/cli | tee -a $L
for c in 'Cases/Sm90DsaBackward.MatchesReference/H64_D576_K100_LengthsInvalid'; do
  timeout 60 compute-sanitizer --tool synccheck /tmp/a/bins/t_v4 --gtest_brief=1 --gtest_filter="$c" 2>&1 \
    | grep -E "ERROR SUMMARY|PASSED|FAILED" | sed "s|^|main t_v4 $c: |" | tee -a $L
done
