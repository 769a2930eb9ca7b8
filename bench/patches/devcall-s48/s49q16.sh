#!/usr/bin/env bash
# (Copy into .devcall/.) Prepared in session 48 for session 49 (~420 s; carry this script,
# .devcall/q16.tar.xz (bins/cli_q16, t_q16: branch exp/indexer-dk-quad16), .devcall/s48a.tar.xz
# (bins/cli_main: main before session 48, the same indexer loss and default DSA backward code as
# main after it), .devcall/l64.tar.xz (cli64: the merged deterministic 64-byte form) and
# .devcall/e0.tar.xz (cli_e0: s48-dsa-det-e0-diagnostic.patch on it); ~42 MB; rebuild if gone):
# the indexer loss's dk reductions in quad-16 order (128-byte red.v4 lines) against main, the
# default DSA backward's rows beside them (its reduction now goes through the shared
# quad16_pair: SASS 288 lines shorter), the deterministic E-0 diagnostic against the 64-byte
# form, then the loss and DSA backward suites with sanitizers.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/q /tmp/l /tmp/e && tar -xJf .devcall/s48a.tar.xz -C /tmp/a && tar -xJf .devcall/q16.tar.xz -C /tmp/q \
  && tar -xJf .devcall/l64.tar.xz -C /tmp/l && tar -xJf .devcall/e0.tar.xz -C /tmp/e
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
A="--op indexer_loss --seq 4096 --topk 2048 --dsa-heads 128 --dsa-dqk 576"
D="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-dqk 576"
SHAPES="$A --indexer-heads 64;$A --indexer-heads 32;--op indexer_loss --seq 8192 --indexer-heads 64 --dsa-heads 128 --dsa-dqk 576 --loss-mode dense --no-check;$D --dsa-heads 64;$D --dsa-heads 128"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh main=/tmp/a/bins/cli_main q16=/tmp/q/bins/cli_q16 | tee -a $L
# E-0 (docs/research/dsa_det_bwd_design_s48.md): the 64-byte int64 form with half its words
# reduced (D1's L2 traffic, wrong results): build D1 at >= 300 / 305 TFLOPS (H 64 / 128), stop
# every int32 design at <= 265.
OUT=$OUT/e0 SHAPES="$D --dsa-heads 64 --no-check;$D --dsa-heads 128 --no-check" PASSES=2 ROUNDS=3 \
  VARIANT='impl=sm90,deterministic=1' scripts/ab_bins.sh fix64=/tmp/l/bins/cli64 e0=/tmp/e/bins/cli_e0 | tee -a $L
F='*IndexerSm90Loss*:*IndexerGpuLoss*:*IndexerGpuAuto*:*IndexerSm90Auto*:*Sm90DsaBackward*'
C='Cases/IndexerSm90Loss.MatchesReference/HI64_H128_D576_K129_FiveStages:Cases/IndexerSm90Loss.MatchesReference/HI64_H64_D512_K4100_LongRows:Cases/Sm90DsaBackward.MatchesReference/H64_D576_K100_LengthsInvalid'
scripts/shard_check.sh /tmp/q/bins/t_q16 "$F" 8 "$C" $OUT/t | tee -a $L
