#!/usr/bin/env bash
# (Copy into .devcall/ before use.) Prepared in session 47 for session 48 (~450 s; carry this
# script, .devcall/s47g.tar.xz (bins/cli_diag: main + s47-indexer-order-and-no-dk-diag.patch),
# s48a.tar.xz (bins/cli_main = main's CLI, cli_v4 / t_v4 = main + s47-indexer-dk-red-v4.patch) and
# s48b.tar.xz (bins/cli_pro / t_pro = main + s47-indexer-loss-prologue.patch), ~31 MB; rebuild them
# from the patches if .devcall/ is gone): the no-dk diagnostic, one A/B of main / red.v4 /
# prologue, then each patch's loss suites and sanitizers (shards in parallel).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/g /tmp/a /tmp/b
tar -xJf .devcall/s47g.tar.xz -C /tmp/g && tar -xJf .devcall/s48a.tar.xz -C /tmp/a && tar -xJf .devcall/s48b.tar.xz -C /tmp/b
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
A="--op indexer_loss --seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 576"
for hi in 64 32; do
  timeout 60 /tmp/g/bins/cli_diag bench $A --indexer-heads $hi --variants 'impl=sm90/impl=sm90,tune.indexer_order=4' \
    --rounds 5 --no-check 2>&1 | grep -E "^  impl=" | sed "s/^/no-dk H_I $hi: /" | tee -a $L
done
SHAPES="$A --indexer-heads 64;$A --indexer-heads 32;--op indexer_loss --seq 8192 --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --loss-mode dense --no-check"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh main=/tmp/a/bins/cli_main v4=/tmp/a/bins/cli_v4 pro=/tmp/b/bins/cli_pro | tee -a $L
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows:Cases/IndexerGpuLoss.MatchesReference/HI16_H16_D576_K7_OddRanges'
scripts/shard_check.sh /tmp/b/bins/t_pro "$F" 6 "$C" $OUT/tp | sed 's/^/prologue /' | tee -a $L
scripts/shard_check.sh /tmp/a/bins/t_v4 "$F" 6 "$C" $OUT/tv | sed 's/^/red.v4 /' | tee -a $L
