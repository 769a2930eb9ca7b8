#!/usr/bin/env bash
# (Copy into .devcall/ before use.) Prepared in session 47 (carry this script, .devcall/s48a.tar.xz
# for bins/cli_main, and .devcall/s48b.tar.xz: bins/cli_pro, t_pro = main +
# s47-indexer-loss-prologue.patch; rebuild from the patch if .devcall/ is gone). ~150 s:
#   1. the loss suites (8 shards; portable and Hopper kernels share the changed [a]), memcheck and
#      racecheck on a sparse long-row, a five-stage and an odd-range case;
#   2. main's CLI against the patched one: sparse H_I 64 / 32, dense S 8192 (dense mode does not
#      run [a]: it must stay level).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/b && tar -xJf .devcall/s48a.tar.xz -C /tmp/a && tar -xJf .devcall/s48b.tar.xz -C /tmp/b
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows:Cases/IndexerGpuLoss.MatchesReference/HI16_H16_D576_K7_OddRanges'
scripts/shard_check.sh /tmp/b/bins/t_pro "$F" 8 "$C" $OUT/t | tee -a $L
A="--op indexer_loss --seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 576"
SHAPES="$A --indexer-heads 64;$A --indexer-heads 32;--op indexer_loss --seq 8192 --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --loss-mode dense --no-check"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh main=/tmp/a/bins/cli_main pro=/tmp/b/bins/cli_pro | tee -a $L
