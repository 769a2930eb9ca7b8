#!/usr/bin/env bash
# Session 44 call d (carry .whl/cfe-b and this script, right after call c): completes cuDNN-FE,
# then the landing run of issues 33 / 34 (anchors.py --plan cudnn) on $LIBNAME (unpacked by b).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
source scripts/cudnn_fe_env.sh
[ "$CUDNN_FE_READY" = 1 ] || { echo "cuDNN-FE not ready"; exit 3; }
LIB=/tmp/d/bins/${LIBNAME:-lib_q.so}
[ -f $LIB ] || { echo "no library: call b did not run on this machine"; exit 4; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/log.txt
echo "library $LIB" | tee -a $OUT/log.txt
mkdir -p $OUT/cudnn
timeout 400 python3 bench/anchors.py --lib $LIB --plan cudnn --anchors cudnn_fe \
  --impls auto --budget-s 240 --out $OUT/cudnn > $OUT/cudnn/anchors.log 2>&1
echo "cudnn rc=$?" | tee -a $OUT/log.txt
grep -E "^\[|^  (bsa|dsa|indexer)|wrote|unavailable|FAILED" $OUT/cudnn/anchors.log | tail -60
