#!/usr/bin/env bash
# (Copy into .devcall/.) Prepared in session 49 for session 50 (~150 s; carry this script and
# .devcall/s50.tar.xz: bins/t_main = build/sa_tests of main, e.g.
#   mkdir -p /tmp/p/bins && cp build/sa_tests /tmp/p/bins/t_main && tar -cJf .devcall/s50.tar.xz -C /tmp/p bins).
# 1. The binned deterministic DSA backward (tune.sm90_dsa_bwd_det_binned=1; the tests run it as
#    their kSm90Binned variants) through racecheck and synccheck: the gate before it becomes the
#    default deterministic mode (docs/decisions/sm90_dsa_backward.md, "Session 49").
# 2. racecheck on the portable DSA forward's multi-chunk cases at H 16 / 64 / 8: is session 49's
#    report (cp.async zfill against the P V ldmatrix.trans, H8_D512_K100_LengthsInvalidSink) older
#    than H 8? (bench/NOTES.md, session 49.)
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/s && tar -xJf .devcall/s50.tar.xz -C /tmp/s
T=/tmp/s/bins/t_main
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
run_tool() {  # tool filter tag
  timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 $T --gtest_brief=1 --gtest_filter="$2" \
    > $OUT/$1_$3.log 2>&1
  echo "$1 $3 rc=$? | $(grep -E 'SUMMARY' $OUT/$1_$3.log | head -1) | $(grep -E 'PASSED|FAILED' $OUT/$1_$3.log | head -1)" | tee -a $OUT/log.txt
}
D1='Sm90DsaBackwardFixedPoint.*:Cases/Sm90DsaBackward.MatchesReference/H8_D576_K64_Deterministic'
run_tool racecheck "$D1" d1 &
run_tool synccheck "$D1" d1 &
for c in H16_D512_K33_ManyTokens H64_D576_K100_LengthsInvalid H8_D576_K130_PersistentItems H8_D512_K100_LengthsInvalidSink; do
  run_tool racecheck "Cases/DsaForwardGpu.MatchesReference/$c" fwd_$c &
done
wait
