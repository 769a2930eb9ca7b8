#!/usr/bin/env bash
# Session 42's prepared call (run in a later session): warpgroup 0 taking three dKV pieces at
# D_qk 576 (w3) against main: the DSA backward suites and memcheck on w3, then the CLI A/B at
# H 64 (no topk_length), H 128 and H 32 (topk_length), D_qk 576, two passes alternating, and
# the dispatch test of session 42 (AUTO's deterministic choice).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -xJf .devcall/s42w.tar.xz -C /tmp/b
B=/tmp/b/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 120 $B/t_w3 --gtest_brief=1 --gtest_filter='*Sm90DsaBackward*:*DsaTokenGroups*:*DsaBackwardGpu*' > /tmp/w3_$i 2>&1 & pids+=($!)
done
(timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/t_w3 --gtest_brief=1 --gtest_filter='Cases/Sm90DsaBackward.MatchesReference/H128_D576_K130_PersistentItems:Cases/Sm90DsaBackward.MatchesReference/H64_D576_K100_LengthsInvalid' > /tmp/mc.log 2>&1; echo "memcheck rc=$?" >> /tmp/mc.log) & pids+=($!)
for p in "${pids[@]}"; do wait $p; done
cat /tmp/w3_* /tmp/mc.log > $OUT/tests_w3.log
echo "w3:" $(grep -hE "FAILED|tests ran|PASSED" /tmp/w3_* | tr '\n' ' ') | tee -a $L
grep -E "ERROR SUMMARY|rc=" /tmp/mc.log | tee -a $L
run() { timeout 60 "$@" --rounds 3 --no-check 2>&1 | grep -E "^  impl=sm90" | tr -s ' ' | tr '\n' '|'; }
for pass in 1 2; do
  for shape in "--dsa-heads 64 --dsa-dqk 576 --topk-length off" "--dsa-heads 128 --dsa-dqk 576" "--dsa-heads 32 --dsa-dqk 576"; do
    for bin in main w3; do
      echo "dsa p$pass $bin [$shape]: $(run $B/cli_$bin bench --op dsa_bwd --dsa-seq 4096 --topk 2048 $shape --variants impl=sm90)" | tee -a $L
    done
  done
done
