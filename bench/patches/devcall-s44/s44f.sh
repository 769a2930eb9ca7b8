#!/usr/bin/env bash
# Session 44 call f (carry s44e.tar.xz and this script): experiment E1 only (the cluster-pair DSA
# backward, D_qk 512, tune bit 8, against the default kernel in the same binary; the bench checks
# both against the reference). memcheck first on a small shape; a hang shows as a timeout.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/e && tar -xJf .devcall/s44e.tar.xz -C /tmp/e
E=/tmp/e/bins/cli_e1
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $E bench --op dsa_bwd --dsa-seq 512 --topk 256 --dsa-heads 128 --dsa-dqk 512 --topk-length off --variants 'impl=sm90,tune.sm90_dsa_bwd_bits=8' --rounds 1 > $OUT/e1_memcheck.log 2>&1; echo "e1 memcheck rc=$?" | tee -a $L
tail -6 $OUT/e1_memcheck.log | tee -a $L
for run in "1 128" "1 256" "2 128"; do
  set -- $run
  echo "e1 p$1 H$2: $(timeout 40 $E bench --op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-heads $2 --dsa-dqk 512 --topk-length off --variants 'impl=sm90/impl=sm90,tune.sm90_dsa_bwd_bits=8' --rounds 3 2>&1 | tee -a $OUT/e1_bench.log | grep -E '^  impl=' | tr -s ' ' | tr '\n' '|')" | tee -a $L
done
