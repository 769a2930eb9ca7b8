#!/usr/bin/env bash
# Session 45 call f (carry s45f.tar.xz, holding bins/cli_l1 = the CLI built with s45-dsa-bwd-cluster-pair-lag1.patch, and this script): the cluster-pair DSA backward with lag 1
# (tune 8|16: cluster-scope waits; 8|32: CTA-scope xfull wait) against lag 0 (tune 8, E1) and the
# default kernel, one binary; memcheck on a small shape first (a protocol error hangs).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/f && tar -xJf .devcall/s45f.tar.xz -C /tmp/f
E=/tmp/f/bins/cli_l1
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
for m in 24; do
  SA_E1_PRINT_GRID=1 timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 $E bench --op dsa_bwd --dsa-seq 512 --topk 256 --dsa-heads 128 --dsa-dqk 512 --topk-length off --variants "impl=sm90,tune.dsa_bwd=$m" --rounds 1 > $OUT/mc_$m.log 2>&1; echo "memcheck $m rc=$?" | tee -a $L
  grep -E "E1\]|ERROR SUMMARY|PASS|FAIL" $OUT/mc_$m.log | tee -a $L
done
V='impl=sm90/impl=sm90,tune.dsa_bwd=8/impl=sm90,tune.dsa_bwd=24/impl=sm90,tune.dsa_bwd=40'
grep -q "ERROR SUMMARY: 0 errors" $OUT/mc_24.log || V='impl=sm90/impl=sm90,tune.dsa_bwd=8'
S="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 512 --topk-length off"
SA_E1_PRINT_GRID=1 timeout 120 $E bench $S --variants "$V" --rounds 3 2>&1 | tee $OUT/bench1.log | grep -E "E1\]|^  impl=" | tee -a $L
timeout 90 $E bench $S --variants "$V" --rounds 3 --no-check 2>&1 | tee $OUT/bench2.log | grep -E "^  impl=" | tee -a $L
