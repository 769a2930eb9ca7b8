#!/usr/bin/env bash
# Session 23, call 2: es2 tests, sanitizers, A/B, trace.
cd "$(dirname "$0")/.."
tar xJf build-ref/carry.tar.xz
nvidia-smi -L > $OUT/c3.log 2>&1
S=$(date +%s)
timeout 240 ./build/sa_tests --gtest_filter='*Sm90BsaBackward*:*ReverseMap*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(($(date +%s)-S))s: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')" >> $OUT/c3.log
C=Cases/GpuSm90BsaBackward.MatchesReference
F="$C/Block128D128MhaBhsdSingleOwner:$C/Block128D128GqaBshdPartialEmptyRowsUnattendedBucket1:$C/Block128D64MqaFixedCountPartialBucket2:$C/Block128D128GqaPartialEmptyRowsDeterministic:$C/Block128D128LongReverseRowsSingleOwner:$C/Block64D128MhaBucket1:$C/Block64D128MhaDeterministic"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 ./build/sa_tests --gtest_filter="$F" > $OUT/san_$tool.log 2>&1
  echo "$tool rc=$? $(($(date +%s)-S))s: $(grep -E 'PASSED|FAILED|SUMMARY' $OUT/san_$tool.log | tr '\n' ' ')" >> $OUT/c3.log
done
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192"
SHAPES="--op bsa_bwd $H --dim 128 --block 128 --density 0.5;--op bsa_bwd $H --dim 128 --block 128 --density 0.125;--op bsa_bwd $H --dim 128 --block 64 --density 0.5;--op bsa_bwd $H --dim 64 --block 128 --density 0.5"
SHAPES="$SHAPES" PASSES=2 BIN=build/sparse-attention OUT=$OUT bash scripts/ab_libs.sh main=build-ref/main es3a=build-ref/es3a es3b=build >> $OUT/c3.log 2>&1
echo "ab done $(($(date +%s)-S))s" >> $OUT/c3.log
rm -f $OUT/trace.tmp
echo "all done $(($(date +%s)-S))s" >> $OUT/c3.log
cat $OUT/c3.log
