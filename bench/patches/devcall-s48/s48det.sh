#!/usr/bin/env bash
# (Copy into .devcall/.) Session 48: the DSA backward's fixed-point deterministic mode (carry this
# script and .devcall/det.tar.xz: bins/cli, bins/t built at the change). The DSA backward suites
# in shards with memcheck / racecheck / synccheck on the fixed-point cases, then one bench of the
# Hopper backward, default against deterministic, and the portable deterministic one, at the
# issue-33 shapes.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/det.tar.xz -C /tmp/d
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
F='*DsaBackwardGpu*:*Sm90DsaBackward*:*DsaFixedPoint*'
C='Sm90DsaBackwardFixedPoint.*:Cases/Sm90DsaBackward.MatchesReference/H8_D576_K64_Deterministic'
scripts/shard_check.sh /tmp/d/bins/t "$F" 8 "$C" $OUT/t | tee -a $L
V='impl=sm90/impl=sm90,deterministic=1/impl=portable,deterministic=1'
for args in "--dsa-heads 128 --dsa-dqk 576" "--dsa-heads 64 --dsa-dqk 576" \
            "--dsa-heads 64 --dsa-dqk 512" "--dsa-heads 32 --dsa-dqk 576"; do
  timeout 100 /tmp/d/bins/cli bench --op dsa_bwd --dsa-seq 4096 --topk 2048 $args \
    --variants "$V" --rounds 3 --calls 10 --json $OUT/det.jsonl 2>&1 | grep -E "^  impl=|error|FAIL" \
    | sed "s/^/$args: /" | tee -a $L
done
timeout 60 /tmp/d/bins/cli bench --op dsa_bwd --dsa-seq 8192 --topk 2048 --dsa-heads 128 --dsa-dqk 576 \
  --variants 'impl=sm90/impl=sm90,deterministic=1' --rounds 3 --calls 10 --json $OUT/det.jsonl 2>&1 \
  | grep -E "^  impl=|error|FAIL" | sed "s/^/S8192 H128: /" | tee -a $L
