#!/usr/bin/env bash
# Session 47 call d (carry this script, .devcall/s47c.sh and .devcall/s47d.tar.xz: bins/cli_o,
# t_o = main + the indexer order tuning, tune.indexer_order bits 1 loss / 2 target heaviest first):
#   1. the indexer loss suites (8 shards), memcheck / racecheck / synccheck on four loss cases;
#   2. sparse loss, in one process: order 0 (main) / 1 (loss kernel heaviest first) / 2 (target) /
#      3 (both; session 46's measured build), H_I 64 and 32;
#   3. s47c.sh with cli_o as main's CLI (tuning 0 = main): per-kernel durations of the sparse call,
#      ncu of the target and the loss kernel, the BSA forward's SM balance.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d/bins && tar -xJf .devcall/s47d.tar.xz -C /tmp/d
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows:Cases/IndexerGpuLoss.MatchesReference/HI16_H16_D576_K7_OddRanges:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D576_K160_Deterministic'
scripts/shard_check.sh $B/t_o "$F" 8 "$C" $OUT/t | tee -a $L
for hi in 64 32; do
  timeout 150 $B/cli_o bench --op indexer_loss --seq 4096 --indexer-heads $hi --topk 2048 --dsa-heads 128 --dsa-dqk 576 \
    --variants 'impl=sm90/impl=sm90,tune.indexer_order=1/impl=sm90,tune.indexer_order=2/impl=sm90,tune.indexer_order=3' \
    --rounds 5 2>&1 | grep -E "^  impl=|pass|check" | sed "s/^/order H_I $hi: /" | tee -a $L
done
cp $B/cli_o $B/cli_m
mkdir -p $OUT/prof
OUT=$OUT/prof bash .devcall/s47c.sh > /dev/null 2>&1
cat $OUT/prof/log.txt >> $L; rm -f $OUT/prof/log.txt
tail -20 $L
