#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Prepared in session 46 for session 47 (carry this script, .devcall/s47b.tar.xz (~10 MB:
# bins/cli_tail, t_tail = main + s46-bsa-fwd-tail-split.patch) and .devcall/s47a.tar.xz (for main's
# CLI, cli_m); rebuild from the patch if .devcall/ is gone). Run it after s47a's H 33 check showed
# the tail (block 64: H 33 / H 32 per-FLOP rate >= 1.02). ~200 s:
#   1. the forward suites with the new tail cases, sanitizers on the G = 8 tail cases;
#   2. A/B: main's CLI against the branch's (auto), and the branch with the tail off
#      (tune.fwd_tail=1) in one process; the H 33 check on the branch.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/s47b.tar.xz -C /tmp/d && tar -xJf .devcall/s47a.tar.xz -C /tmp/d
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
F='Cases/Sm90BsaForwardTail.*:Sm90BsaForwardTailRealGrid.*:Sm90BsaForwardTailGraph.*:Sm90BsaForwardSplitKv.*'
F+=':Cases/Sm90BsaForward.*:Cases/Sm90BsaForwardFp16.*:*GpuBsaMask*:*GpuBsaVarlen*:*GpuBsaForward*'
C='Cases/Sm90BsaForwardTail.MatchesReference/Block128D128R1Auto:Cases/Sm90BsaForwardTail.MatchesReference/Block64D128R7ForcedS3TailCounts01:Cases/Sm90BsaForwardTail.MatchesReference/Block64D64Fp16ForcedS16MoreSlicesThanBlocks:Cases/Sm90BsaForwardTail.MatchesReference/Block128D128GqaB2TailAcrossKvHeads:Cases/Sm90BsaForwardTail.WithoutWorkspaceRunsUnsplit/Block128D128R1Auto'
scripts/shard_check.sh $B/t_tail "$F" 10 "$C" $OUT | tee -a $L
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
SHAPES="--op bsa_fwd $H --block 64 --density 0.5;--op bsa_fwd $H --block 64 --density 0.125;--op bsa_fwd $H --block 128 --density 0.5"
OUT=$OUT/ab SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh m=$B/cli_m tail=$B/cli_tail | tee -a $L
for d in 0.5 0.125; do
  timeout 90 $B/cli_tail bench --op bsa_fwd $H --block 64 --density $d --rounds 3 \
    --variants 'impl=sm90/impl=sm90,tune.fwd_tail=1' 2>&1 | grep -E "^  impl=" | sed "s/^/in-process b64 $d: /" | tee -a $L
done
for h in 32 33 32 33; do
  echo "tail b64 H$h: $(timeout 60 $B/cli_tail bench --op bsa_fwd --batch 1 --heads $h --kv-heads $h --seq 8192 --dim 128 --block 64 --density 0.5 --variants impl=sm90 --rounds 3 --no-check 2>&1 | grep -E '^  impl=' | tr -s ' ')" | tee -a $L
done
