#!/usr/bin/env bash
# Session 41, call f (the last of the budget): g3's DSA backward tests + memcheck, and its A/B
# against main's CLI (H 64 / 128, D_qk 576), two passes alternating.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -xJf .devcall/s41f.tar.xz -C /tmp/b
B=/tmp/b/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv | tee $L
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 100 $B/t_g3 --gtest_brief=1 --gtest_filter='*Sm90DsaBackward*:*DsaTokenGroups*:*Sm90BsaForward.*' > /tmp/g3_$i 2>&1 & pids+=($!)
done
(timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/t_g3 --gtest_brief=1 --gtest_filter='Cases/Sm90DsaBackward.MatchesReference/H128_D576_K130_PersistentItems' > /tmp/mc.log 2>&1; echo "memcheck rc=$?" >> /tmp/mc.log) & pids+=($!)
for p in "${pids[@]}"; do wait $p; done
cat /tmp/g3_* /tmp/mc.log > $OUT/tests_g3.log
echo "g3:" $(grep -hE "FAILED|tests ran" /tmp/g3_* | tr '\n' ' ') | tee -a $L
grep -E "ERROR SUMMARY|rc=" /tmp/mc.log | tee -a $L
run() { timeout 60 "$@" --rounds 3 --no-check 2>&1 | grep -E "^  impl=sm90" | tr -s ' ' | tr '\n' '|'; }
for pass in 1 2; do
  for shape in "--dsa-heads 64 --dsa-dqk 576 --topk-length off" "--dsa-heads 128 --dsa-dqk 576"; do
    for bin in main g3; do
      echo "dsa p$pass $bin [$shape]: $(run $B/cli_$bin bench --op dsa_bwd --dsa-seq 4096 --topk 2048 $shape --variants impl=sm90)" | tee -a $L
    done
  done
done
for bin in main g3 main g3; do
  echo "bsa_fwd $bin b64 12.5%: $(run $B/cli_$bin bench --op bsa_fwd --batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128 --block 64 --density 0.125 --variants impl=sm90)" | tee -a $L
done
