#!/usr/bin/env bash
# Session 47 call c: where the sparse indexer loss call's time goes on main (issue 34's rate
# floor, 1% short on the H100). Per-kernel durations of one call, then ncu --set full with SASS of
# the attention target and of the loss kernel. Carry .devcall/s47c.tar.xz (bins/cli_m = main's CLI, xz'd alone).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && { [ -x /tmp/d/bins/cli_m ] || tar -xJf .devcall/s47c.tar.xz -C /tmp/d; }
B=/tmp/d/bins
L=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $L
A="bench --op indexer_loss --seq 4096 --indexer-heads 64 --topk 2048 --dsa-heads 128 --dsa-dqk 576 --variants impl=sm90"
timeout 60 $B/cli_m $A --rounds 3 --no-check 2>&1 | grep -E "^  impl=" | tee -a $L
timeout 120 ncu --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second \
  --csv -f $B/cli_m $A --rounds 1 --warmup 1 --calls 1 --no-check > $OUT/durations.csv 2>/tmp/dur.err
echo "durations rc=$?" | tee -a $L
grep -E "gpu__time_duration" $OUT/durations.csv | awk -F'","' '{print $5" | "$NF}' | cut -c1-160 | tee -a $L
for k in target_rs loss_sm90; do
  timeout 150 ncu --set full --import-source no -k regex:$k -s 1 -c 1 -f -o /tmp/$k $B/cli_m $A \
    --rounds 1 --warmup 1 --calls 1 --no-check > /tmp/$k.log 2>&1
  echo "$k ncu rc=$?" | tee -a $L
  ncu --import /tmp/$k.ncu-rep --page details --csv > $OUT/${k}_details.csv 2>&1
  ncu --import /tmp/$k.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -9 > $OUT/${k}_sass.csv.xz
done
ls -la $OUT
# Load balance of the BSA forward over the SMs: causal MoBA rows (diagonal + 25% of the earlier
# blocks, mask=causal) against the fixed-count 50% rows. SM active cycles min / avg / max against
# the elapsed cycles (issue 38's static round robin question).
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
for cfg in "128 --blocks causal --density 0.25 --mask causal" "64 --blocks causal --density 0.25 --mask causal" "128 --density 0.5" "64 --density 0.5"; do
  set -- $cfg; blk=$1; shift
  timeout 60 ncu --metrics sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max \
    -k regex:bsa_forward -s 2 -c 1 --csv $B/cli_m bench --op bsa_fwd $H --block $blk "$@" --variants impl=sm90 \
    --rounds 1 --warmup 1 --calls 1 --no-check 2>/dev/null | grep -E "sm__cycles" | awk -F'","' -v t="b$blk $*" '{print t" | "$(NF-2)" "$NF}' | tee -a $L
done
