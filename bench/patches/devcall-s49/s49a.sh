#!/usr/bin/env bash
# Session 49, call 1 (bench/patches/devcall-s49/s49a.sh; carry it and .devcall/s49a.tar.xz:
# bins/cli_main + t_main = main 6f80128, cli_q16 + t_q16 = s48-indexer-dk-quad16.patch on it,
# cli_e0 = s48-dsa-det-e0-diagnostic.patch on it): the quad-16 indexer dk A/B with the default
# DSA backward rows, E-0 against main's deterministic 64-byte form, then the loss and DSA
# backward suites (both builds' DSA backward) with sanitizers.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/s && tar -xJf .devcall/s49a.tar.xz -C /tmp/s
B=/tmp/s/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
A="--op indexer_loss --seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 576"
D="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-dqk 576"
SHAPES="$A --indexer-heads 64;$A --indexer-heads 32;--op indexer_loss --seq 8192 --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --loss-mode dense --no-check;$D --dsa-heads 64;$D --dsa-heads 128"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh main=$B/cli_main q16=$B/cli_q16 | tee -a $L
OUT=$OUT/e0 SHAPES="$D --dsa-heads 64 --no-check;$D --dsa-heads 128 --no-check" PASSES=2 ROUNDS=3 \
  VARIANT='impl=sm90,deterministic=1' scripts/ab_bins.sh fix64=$B/cli_main e0=$B/cli_e0 | tee -a $L
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*:*Sm90DsaBackward*:*DsaBackwardGpu*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows:Cases/Sm90DsaBackward.MatchesReference/H64_D576_K100_LengthsInvalid:Sm90DsaBackwardFixedPoint.*'
echo "== q16 suites" | tee -a $L
scripts/shard_check.sh $B/t_q16 "$F" 8 "$C" $OUT/tq | tee -a $L
echo "== main DSA suites (H 8 forward and dispatch included)" | tee -a $L
scripts/shard_check.sh $B/t_main '*Sm90DsaBackward*:*DsaBackwardGpu*:*Sm90DsaForward*:*DsaForwardGpu*' 8 'Sm90DsaBackwardFixedPoint.*:Cases/Sm90DsaBackward.MatchesReference/H64_D576_K100_LengthsInvalid:Cases/Sm90DsaForward.MatchesReference/H8_D512_K100_LengthsInvalidSink:Cases/DsaForwardGpu.MatchesReference/H8_D512_K100_LengthsInvalidSink:Cases/DsaBackwardGpu.MatchesReference/H8_D512_K100_LengthsInvalidSink' $OUT/tm | tee -a $L
