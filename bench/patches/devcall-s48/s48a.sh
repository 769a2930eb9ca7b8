#!/usr/bin/env bash
# (Copy into .devcall/ before use.) Prepared in session 47 for session 48's first call (carry this
# script, .devcall/s47g.tar.xz (bins/cli_diag: main + s47-indexer-order-and-no-dk-diag.patch) and
# .devcall/s48a.tar.xz (bins/cli_main = main's CLI at 66b3539's sources, cli_v4 / t_v4 = main +
# s47-indexer-dk-red-v4.patch); rebuild them from the patches if .devcall/ is gone). ~250 s:
#   1. the no-dk diagnostic: the sparse call with and without the loss kernel's dk reductions
#      (tune.indexer_order=4, --no-check), one process, H_I 64 and 32: the bound on any reduction
#      change (stop rules: docs/research/indexer_loss_union_pair_s47.md);
#   2. the red.v4 patch: the loss suites (8 shards), memcheck / racecheck on two loss cases, then
#      main's CLI against the branch's, sparse H_I 64 / 32 and dense S 8192.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/g /tmp/a && tar -xJf .devcall/s47g.tar.xz -C /tmp/g && tar -xJf .devcall/s48a.tar.xz -C /tmp/a
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
A="--op indexer_loss --seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 576"
for i in 1 2; do for hi in 64 32; do
  timeout 60 /tmp/g/bins/cli_diag bench $A --indexer-heads $hi --variants 'impl=sm90/impl=sm90,tune.indexer_order=4' \
    --rounds 5 --no-check 2>&1 | grep -E "^  impl=" | sed "s/^/no-dk run $i H_I $hi: /" | tee -a $L
done; done
B=/tmp/a/bins
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows'
scripts/shard_check.sh $B/t_v4 "$F" 8 "$C" $OUT/t | tee -a $L
SHAPES="$A --indexer-heads 64;$A --indexer-heads 32;--op indexer_loss --seq 8192 --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --loss-mode dense --no-check"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh main=$B/cli_main v4=$B/cli_v4 | tee -a $L
