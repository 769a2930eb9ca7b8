#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Prepared in session 45 for session 46's first call (carry .devcall/s46a.tar.xz and this
# script; ~250 s). s46a.tar.xz holds bins/: cli_q (main's CLI at 2e0dfff, the baseline),
# cli_sel and t_sel (s45-dsa-bwd-cluster-pair-lag1.patch applied: dQ panel move + lag-1 pair with
# runtime rank selects; CLI and sa_tests), cli_t and t_t (s45-target-consumer-turns.patch applied: CLI and sa_tests). If
# .devcall/ is gone, rebuild them from the two patches (bench/patches/README.md).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/s46a.tar.xz -C /tmp/d
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
# 1. The cluster pair with register room. memcheck (a protocol error hangs: timeout), then the
#    A/B with the check on (pass 1) and off (pass 2).
SA_E1_PRINT_GRID=1 timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cli_sel bench --op dsa_bwd --dsa-seq 512 --topk 256 --dsa-heads 128 --dsa-dqk 512 --topk-length off --variants 'impl=sm90,tune.dsa_bwd=24' --rounds 1 > $OUT/mc_sel.log 2>&1; echo "memcheck sel rc=$?" | tee -a $L
grep -E "E1\]|ERROR SUMMARY|PASS|FAIL" $OUT/mc_sel.log | tee -a $L
V='impl=sm90/impl=sm90,tune.dsa_bwd=8/impl=sm90,tune.dsa_bwd=24/impl=sm90,tune.dsa_bwd=40'
grep -q "ERROR SUMMARY: 0 errors" $OUT/mc_sel.log || V='impl=sm90/impl=sm90,tune.dsa_bwd=8'
S="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 512 --topk-length off"
for pass in 1 2; do
  CHK=""; [ $pass = 2 ] && CHK="--no-check"
  echo "pass $pass q: $(timeout 60 $B/cli_q bench $S --variants impl=sm90 --rounds 3 $CHK 2>&1 | grep -E '^  impl=' | tr -s ' ')" | tee -a $L
  timeout 120 $B/cli_sel bench $S --variants "$V" --rounds 3 $CHK 2>&1 | tee -a $OUT/sel_bench.log | grep -E "^  impl=" | sed "s/^/pass $pass sel: /" | tee -a $L
done
# 1b. If lag 1 (mode 2, tune 24) beat main by 5% in pass 2: the DSA backward suites on the
#     branch's tests (t_sel: the dQ move is in every D_qk 512 kernel, token groups and
#     deterministic included), in shards, and memcheck / racecheck on the pair.
q=$(grep "^pass 2 q:" $L | awk '{print $6}'); m2=$(grep "^pass 2 sel:.*tune.dsa_bwd=24 " $L | awk '{print $6}')
echo "pass 2: main $q ms, mode 2 $m2 ms" | tee -a $L
if [ -n "$q" ] && [ -n "$m2" ] && awk -v a="$q" -v b="$m2" 'BEGIN{exit !(a / b >= 1.05)}'; then
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 200 $B/t_sel --gtest_brief=1 --gtest_filter='*Sm90DsaBackward*:*DsaTokenGroups*:*DsaBackwardGpu*' > /tmp/s_$i 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  cat /tmp/s_* > $OUT/tests_sel.log
  echo "sel tests:" $(grep -hE "FAILED|PASSED|SKIPPED" /tmp/s_* | sort | uniq -c | tr '\n' ' ') | tee -a $L
  grep -hE "^\[  FAILED" /tmp/s_* | head -10 | tee -a $L
fi
# 2. The indexer target's consumer turns: loss suites, sanitizers (incl. the one-group shapes),
#    then the sparse / dense loss A/B against main.
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 200 $B/t_t --gtest_brief=1 --gtest_filter='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*' > /tmp/t_$i 2>&1 & pids+=($!)
done
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI16_H128_D576_K1_OneKey:Cases/IndexerSm90Loss.MatchesReference/Dense_HI64_H128_D576_OddRanges_Skv200:Cases/IndexerSm90Loss.MatchesReference/HI32_H192_D576_K96_ThreeGroups:Cases/IndexerSm90Loss.MatchesReference/HI16_H300_D512_K33_FiveGroups:Cases/IndexerSm90Loss.MatchesReference/HI32_H128_D576_K416_ThirteenStages'
for tool in memcheck racecheck synccheck; do
  (timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/t_t --gtest_brief=1 --gtest_filter="$C" > /tmp/$tool.log 2>&1; echo "$tool rc=$?" >> /tmp/$tool.log) & pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
cat /tmp/t_* /tmp/memcheck.log /tmp/racecheck.log /tmp/synccheck.log > $OUT/tests.log
echo "tests:" $(grep -hE "FAILED|PASSED|SKIPPED" /tmp/t_* | sort | uniq -c | tr '\n' ' ') | tee -a $L
grep -hE "^\[  FAILED" /tmp/t_* | head -10 | tee -a $L
grep -hE "ERROR SUMMARY|rc=|RACECHECK SUMMARY" /tmp/memcheck.log /tmp/racecheck.log /tmp/synccheck.log | tee -a $L
SHAPES="--op indexer_loss --seq 4096 --indexer-heads 64 --topk 2048 --dsa-heads 128 --dsa-dqk 576;--op indexer_loss --seq 8192 --loss-mode dense --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --no-check"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh q=$B/cli_q t=$B/cli_t | tee -a $L
