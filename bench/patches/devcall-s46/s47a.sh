#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Prepared in session 46 for session 47's first call (carry this script and .devcall/s47a.tar.xz,
# ~12 MB: bins/cli_m = main's CLI at f8de9fc, cli_v3 / t_v3 = main + s46-bsa-fwd-list-ahead.patch;
# rebuild them from the patch if .devcall/ is gone). ~250 s:
#   1. the block-64 / 128 forward's tail round: H 33 (tiles a multiple of 132) against H 32;
#   2. the list-ahead patch: the forward suites, memcheck / racecheck / synccheck on the ring and
#      count cases, then the A/B against main at block 128 / 64, 12.5% / 50%;
#   3. ncu (--set full, SASS) of main's forward at block 128 and 64, 12.5% and 50%.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/s47a.tar.xz -C /tmp/d
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
for blk in 64 128; do for h in 32 33 32 33; do
  echo "tail b$blk H$h: $(timeout 60 $B/cli_m bench --op bsa_fwd --batch 1 --heads $h --kv-heads $h --seq 8192 --dim 128 --block $blk --density 0.5 --variants impl=sm90 --rounds 3 --no-check 2>&1 | grep -E '^  impl=' | tr -s ' ')" | tee -a $L
done; done
F='*Sm90BsaForward*:*GpuBsaMask*:*GpuBsaVarlen*:*GpuBsaForward*'
CF='Cases/Sm90BsaForward.MatchesReference/Block64D128GqaBshdPartialLenEmptyRows:Cases/Sm90BsaForward.MatchesReference/Block64D64CountZero:Cases/Sm90BsaForward.MatchesReference/Block64D64RowOf150Blocks:Cases/Sm90BsaForward.MatchesReference/Block64D64PersistentManyTiles:Cases/Sm90BsaForward.MatchesReference/Block128D128CountZero:Cases/Sm90BsaForward.MatchesReference/Block128D64PersistentManyTiles'
scripts/shard_check.sh $B/t_v3 "$F" 10 "$CF" $OUT | tee -a $L
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
SHAPES="--op bsa_fwd $H --block 128 --density 0.125;--op bsa_fwd $H --block 64 --density 0.125;--op bsa_fwd $H --block 128 --density 0.5;--op bsa_fwd $H --block 64 --density 0.5"
OUT=$OUT/abf SHAPES="$SHAPES" PASSES=2 ROUNDS=3 scripts/ab_bins.sh m=$B/cli_m v3=$B/cli_v3 | tee -a $L
for cfg in "128 0.125" "128 0.5" "64 0.125" "64 0.5"; do
  set -- $cfg; tag=b$1_$(echo $2 | tr -d .)
  timeout 100 ncu --set full --import-source no -k regex:bsa_forward -c 1 -f -o /tmp/$tag \
    $B/cli_m bench --op bsa_fwd $H --block $1 --density $2 --variants impl=sm90 --rounds 1 \
    --warmup 1 --calls 1 --no-check > /tmp/$tag.log 2>&1
  echo "$tag ncu rc=$?" | tee -a $L
  ncu --import /tmp/$tag.ncu-rep --page details --csv > $OUT/${tag}_details.csv 2>&1
  ncu --import /tmp/$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -9 > $OUT/${tag}_sass.csv.xz
done
