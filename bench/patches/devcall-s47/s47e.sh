#!/usr/bin/env bash
# Session 47 call e (carry this script and .devcall/s47e.tar.xz: bins/cli_dyn, t_dyn = branch
# exp/bsa-fwd-dyn-tiles, dynamic tiles for the masked and packed BSA forward):
#   1. the forward's mask / packed / sm90 suites with the new dynamic-tile cases (8 shards),
#      memcheck / racecheck / synccheck on three dynamic cases;
#   2. causal MoBA (diagonal + 25% of the earlier blocks, mask causal), static (tune.fwd_dyn=1)
#      against dynamic (2) in one process, block 128 and 64, two runs each.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/e && tar -xJf .devcall/s47e.tar.xz -C /tmp/e
B=/tmp/e/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
for i in 1 2; do for blk in 128 64; do
  timeout 100 $B/cli_dyn bench --op bsa_fwd $H --block $blk --blocks causal --density 0.25 --mask causal \
    --variants 'impl=sm90,tune.fwd_dyn=1/impl=sm90,tune.fwd_dyn=2' --rounds 5 2>&1 | grep -E "^  impl=" | sed "s/^/moba b$blk run $i: /" | tee -a $L
done; done
F='*GpuBsaMask*:*GpuBsaVarlen*:*Sm90BsaForward*'
C='Cases/GpuBsaMaskDynamicTiles.Sm90DynamicEqualsStaticBitwise/MobaBlock64D64TwoBatches:GpuBsaVarlen.Sm90DynamicTilesEqualStaticBitwise:GpuBsaMaskDynamicTilesGraph.Sm90ReplaysResetTheCounter'
scripts/shard_check.sh $B/t_dyn "$F" 8 "$C" $OUT/t | tee -a $L
