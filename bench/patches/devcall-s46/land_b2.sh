#!/usr/bin/env bash
# (Copy into .devcall/ with devcall-s45/land_a.sh and land_b.sh: the scripts run from there.)
# Landing run, call 2 of 2 with a profile after it (carry .whl/cfe-b, this script and
# .devcall/land_b.sh, within 30 s of land_a.sh on the same machine): land_b.sh's anchors.py run,
# then ncu of the BSA forward at block 64, 50% (ours and cuDNN-FE's kernels, --set full) as text.
set -u
cd "$(dirname "$0")/.."
bash .devcall/land_b.sh || exit $?
source scripts/cudnn_fe_env.sh
timeout 150 ncu --profile-from-start off --set full --import-source no -f -o /tmp/bsa64 \
  python3 bench/micro/bsa_fwd_profile.py --lib /tmp/d/bins/lib.so --block 64 > /tmp/ncu.log 2>&1
echo "ncu rc=$?" | tee -a $OUT/log.txt; tail -4 /tmp/ncu.log
ncu --import /tmp/bsa64.ncu-rep --page details --csv > $OUT/bsa64_details.csv 2>&1
ncu --import /tmp/bsa64.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
xz -9 < /tmp/src.csv > $OUT/bsa64_sass.csv.xz
ls -la $OUT
