#!/usr/bin/env bash
# Session 44 call b (carry s44b.tar.xz, s44e.tar.xz, this script): experiment E1; the
# attention target's index loads two chunks ahead (q) against HEAD (p): loss suites on t_q,
# memcheck / racecheck, sparse / dense loss A/B.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/s44b.tar.xz -C /tmp/d
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
mkdir -p /tmp/e && tar -xJf .devcall/s44e.tar.xz -C /tmp/e
# EXPERIMENT E1 first (a hang shows as a timeout): the cluster-pair DSA backward (D_qk 512, H 128,
# static items; tune bit 8) against the default kernel in the same binary, checked against the
# reference by the bench; memcheck on a small shape.
E=/tmp/e/bins/cli_e1
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $E bench --op dsa_bwd --dsa-seq 512 --topk 256 --dsa-heads 128 --dsa-dqk 512 --topk-length off --variants 'impl=sm90,tune.sm90_dsa_bwd_bits=8' --rounds 1 > $OUT/e1_memcheck.log 2>&1; echo "e1 memcheck rc=$?" | tee -a $L
tail -4 $OUT/e1_memcheck.log | tee -a $L
grep -q "ERROR SUMMARY: 0 errors" $OUT/e1_memcheck.log && for pass in 1 2; do
  for sh in "--dsa-heads 128" "--dsa-heads 256"; do
    echo "e1 p$pass $sh: $(timeout 60 $E bench --op dsa_bwd --dsa-seq 4096 --topk 2048 $sh --dsa-dqk 512 --topk-length off --variants 'impl=sm90/impl=sm90,tune.sm90_dsa_bwd_bits=8' --rounds 3 2>&1 | grep -E '^  impl=' | tr -s ' ' | tr '\n' '|')" | tee -a $L
  done
done
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 200 $B/t_q --gtest_brief=1 --gtest_filter='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*' > /tmp/t_$i 2>&1 & pids+=($!)
done
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI16_H128_D576_K1_OneKey:Cases/IndexerSm90Loss.MatchesReference/Dense_HI64_H128_D576_OddRanges_Skv200:Cases/IndexerSm90Loss.MatchesReference/HI32_H128_D576_K416_ThirteenStages'
(timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/t_q --gtest_brief=1 --gtest_filter="$C" > /tmp/mc.log 2>&1; echo "memcheck rc=$?" >> /tmp/mc.log) & pids+=($!)
(timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $B/t_q --gtest_brief=1 --gtest_filter="$C" > /tmp/rc.log 2>&1; echo "racecheck rc=$?" >> /tmp/rc.log) & pids+=($!)
for p in "${pids[@]}"; do wait $p; done
cat /tmp/t_* /tmp/mc.log /tmp/rc.log > $OUT/tests.log
echo "tests:" $(grep -hE "FAILED|PASSED|SKIPPED" /tmp/t_* | sort | uniq -c | tr '\n' ' ') | tee -a $L
grep -hE "^\[  FAILED" /tmp/t_* | head -10 | tee -a $L
grep -E "ERROR SUMMARY|rc=|RACECHECK SUMMARY" /tmp/mc.log /tmp/rc.log | tee -a $L
SHAPES="--op indexer_loss --seq 4096 --indexer-heads 64 --topk 2048 --dsa-heads 128 --dsa-dqk 576;--op indexer_loss --seq 8192 --loss-mode dense --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --no-check"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh p=$B/cli_p q=$B/cli_q | tee -a $L
