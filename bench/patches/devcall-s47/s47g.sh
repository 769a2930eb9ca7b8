#!/usr/bin/env bash
# Session 47 call g: the sparse loss kernel without its dk reductions (diagnostic build of
# exp/indexer-order: tune.indexer_order bit 4 skips reduce_dk_row in the sparse pipelined loss
# kernel; dk wrong by construction, --no-check), against the same binary with them, one process.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/g && tar -xJf .devcall/s47g.tar.xz -C /tmp/g
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2; do for hi in 64 32; do
  timeout 60 /tmp/g/bins/cli_diag bench --op indexer_loss --seq 4096 --indexer-heads $hi --topk 2048 --dsa-heads 128 --dsa-dqk 576 \
    --variants 'impl=sm90/impl=sm90,tune.indexer_order=4' --rounds 5 --no-check 2>&1 | grep -E "^  impl=" | sed "s/^/run $i H_I $hi: /"
done; done
