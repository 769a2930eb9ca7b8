#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Issue 38's landing run (one call, no cuDNN-FE wheels: carry this script and
# .devcall/land.tar.xz, which holds bins/lib.so = HEAD's build/libsparse_attention.so, xz'd):
# bench/anchors.py --plan mask: the causal MoBA and window rows beside FlexAttention with the same
# BlockMask and a causal mask_mod, masked against unmasked on the same lists, and the packed batch
# against one sequence, block 128 then 64. Since session 47 the masked / packed forward takes
# dynamic tiles at block 128 (internal A/B: MoBA +5.8%, block 64 +13.9% from a removed spill).
# Results: python3 bench/report.py --name <card>-<date>-sNN-mask <OUT>/mask/anchors.json
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
mkdir -p /tmp/d && tar -xJf .devcall/land.tar.xz -C /tmp/d
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/log.txt
mkdir -p $OUT/mask
timeout 560 python3 bench/anchors.py --lib /tmp/d/bins/lib.so --plan mask --anchors flex \
  --impls auto --budget-s 420 --out $OUT/mask > $OUT/mask/anchors.log 2>&1
echo "mask rc=$?" | tee -a $OUT/log.txt
grep -E "^\[|^  bsa|rate vs|wrote|FAILED|Error" $OUT/mask/anchors.log | tail -60
