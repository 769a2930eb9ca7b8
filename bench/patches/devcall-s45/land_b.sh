#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Landing run, call 2 of 2 (carry .whl/cfe-b and this script, within 30 s of call 1 on the same
# machine): completes cuDNN-FE and runs bench/anchors.py --plan cudnn on the library call 1
# unpacked. Results: python3 bench/report.py --name <card>-<date>-sNN-cudnn <OUT>/cudnn/anchors.json
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
source scripts/cudnn_fe_env.sh
[ "$CUDNN_FE_READY" = 1 ] || { echo "cuDNN-FE not ready"; exit 3; }
LIB=/tmp/d/bins/lib.so
[ -f $LIB ] || { echo "no library: call 1 did not run on this machine"; exit 4; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/log.txt
mkdir -p $OUT/cudnn
timeout 400 python3 bench/anchors.py --lib $LIB --plan cudnn --anchors cudnn_fe \
  --impls auto --budget-s 240 --out $OUT/cudnn > $OUT/cudnn/anchors.log 2>&1
echo "cudnn rc=$?" | tee -a $OUT/log.txt
grep -E "^\[|^  (bsa|dsa|indexer)|wrote|unavailable|FAILED" $OUT/cudnn/anchors.log | tail -60
