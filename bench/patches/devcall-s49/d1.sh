#!/usr/bin/env bash
# D1 step (b), its first device call (not yet run): the binned deterministic DSA backward
# (Tuning::sm90_dsa_bwd_det_binned, branch exp/dsa-det-d1) against the int64 one and the default
# mode, then the deterministic suites with both plans and the sanitizers on one binned case.
# Carry this script and .devcall/d1.tar.xz: bins/cli_d1 (build/sparse-attention) and bins/t_d1
# (build/sa_tests) of the branch, e.g.
#   mkdir -p /tmp/p/bins && cp build/sparse-attention /tmp/p/bins/cli_d1 &&
#   cp build/sa_tests /tmp/p/bins/t_d1 && tar -cJf .devcall/d1.tar.xz -C /tmp/p bins
# Prediction (docs/research/dsa_det_bwd_design_s48.md, section 5; decisions, "Session 49"):
# binned / default 0.82x (H 64) and 0.84x (H 128) if the reductions' bytes set the price, 0.64x
# if their instruction count does. Gates: >= 0.80x at both: merge as the default deterministic
# mode; 0.72-0.80x: setup fusion, then 128-byte requests; < 0.72x: stop, keep int64.
# Two steps, each within one call's 10 minutes: `d1.sh ab` (the A/B and ncu), `d1.sh suites` (the
# tests and sanitizers); no argument runs both (over 10 minutes: give the call its own limit).
set -u
STEP=${1:-all}
cd "$(dirname "$0")/.."
mkdir -p /tmp/s && tar -xJf .devcall/d1.tar.xz -C /tmp/s
B=/tmp/s/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
D="--op dsa_bwd --dsa-seq 4096 --topk 2048 --dsa-dqk 576"
if [ "$STEP" != suites ]; then
# One process per shape and pass, three variants alternating inside it (the first is the anchor
# of the bench's ratios): the default mode, the int64 deterministic mode, the binned one. The
# check stays on: its rel L2 against fp64 is the precision gate (within 1.05x of the default's).
V='impl=sm90/impl=sm90,deterministic=1/impl=sm90,deterministic=1,tune.sm90_dsa_bwd_det_binned=1'
for pass in 1 2; do
  for h in 64 128; do
    echo "== pass $pass H $h" | tee -a $L
    timeout 280 $B/cli_d1 bench $D --dsa-heads $h --variants "$V" --rounds 3 > /tmp/b.log 2>&1
    echo "rc=$?" >> /tmp/b.log
    cat /tmp/b.log >> $OUT/bench.log
    grep -E "^  (variant|impl=)|rc=" /tmp/b.log | tee -a $L
  done
done
# The binned kernel's L2 reductions (requests / sectors against the int64 form's, design: 228 M
# requests, 456 M sectors at H 64), one call each.
M=gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,lts__t_requests_op_red.sum,smsp__inst_executed.sum
for v in 'impl=sm90,deterministic=1' 'impl=sm90,deterministic=1,tune.sm90_dsa_bwd_det_binned=1'; do
  timeout 200 ncu --metrics $M --csv --launch-count 30 $B/cli_d1 bench $D --dsa-heads 64 \
    --variants "$v" --warmup 1 --rounds 1 --calls 1 --no-check > /tmp/n.csv 2>&1
  echo "== ncu $v rc=$?" | tee -a $L
  python3 -c "
import csv
rows=[r for r in csv.reader(open('/tmp/n.csv')) if len(r)>14 and r[0]!='ID']
for r in rows:
  if 'dsa_backward_sm90' in r[4]: print(r[0], r[4][40:110], r[12], r[14])
" | head -24 | tee -a $L
  cp /tmp/n.csv $OUT/ncu_$(echo $v | tr ',=.' '___').csv
done
fi
[ "$STEP" = ab ] && exit 0
# The deterministic suites (int64 plan, binned plan, binned plan with its int64 form forced) and
# the DSA backward suites; memcheck / racecheck / synccheck on the NaN-rows case (all three).
F='*Sm90DsaBackward*:*DsaBackwardGpu*'
C='Sm90DsaBackwardFixedPoint.NaNInQMarksExactlyTheReferenceRows'
echo "== DSA backward suites" | tee -a $L
scripts/shard_check.sh $B/t_d1 "$F" 8 "$C" $OUT/t | tee -a $L
