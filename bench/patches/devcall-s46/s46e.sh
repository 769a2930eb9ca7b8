#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there. Rebuild .devcall/s46e.tar.xz with
# bins/cli = main's build/sparse-attention, xz'd; ~4.6 MB.)
# Session 46 call e: ncu (--set full, SASS source) of the Hopper BSA forward, main's CLI, B1 H32
# S8192 D128: block 128 and 64 at 12.5% and 50% (the per-tile cost; the block-64 gap).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/e && tar -xJf .devcall/s46e.tar.xz -C /tmp/e
B=/tmp/e/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
# The tail check: H 33 makes the tile count a multiple of 132 (b64 4224 = 32 x 132, b128 2112 =
# 16 x 132); H 32 leaves a partial last round (4096 = 31 x 132 + 4, 2048 = 15 x 132 + 68).
for blk in 64 128; do for h in 32 33 32 33; do
  echo "tail b$blk H$h: $(timeout 60 $B/cli bench --op bsa_fwd --batch 1 --heads $h --kv-heads $h --seq 8192 --dim 128 --block $blk --density 0.5 --variants impl=sm90 --rounds 3 --no-check 2>&1 | grep -E '^  impl=' | tr -s ' ')" | tee -a $L
done; done
for cfg in "128 0.125" "128 0.5" "64 0.125" "64 0.5"; do
  set -- $cfg; tag=b$1_$(echo $2 | tr -d .)
  timeout 100 ncu --set full --import-source no -k regex:bsa_forward -c 1 -f -o /tmp/$tag \
    $B/cli bench --op bsa_fwd $H --block $1 --density $2 --variants impl=sm90 --rounds 1 \
    --warmup 1 --calls 1 --no-check > /tmp/$tag.log 2>&1
  echo "$tag ncu rc=$?" | tee -a $L
  ncu --import /tmp/$tag.ncu-rep --page details --csv > $OUT/${tag}_details.csv 2>&1
  ncu --import /tmp/$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -9 > $OUT/${tag}_sass.csv.xz
done
ls -la $OUT | tee -a $L
