#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/det.tar.xz -C /tmp/d
M=gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,smsp__inst_executed.sum,lts__t_requests_op_red.sum
for v in 'impl=sm90' 'impl=sm90,deterministic=1'; do
  timeout 200 ncu --metrics $M --csv --launch-count 30 /tmp/d/bins/cli bench --op dsa_bwd --dsa-seq 4096 --topk 2048 \
    --dsa-heads 64 --dsa-dqk 576 --variants "$v" --warmup 1 --rounds 1 --calls 1 --no-check > /tmp/n.csv 2>&1
  echo "== $v rc=$?"; python3 -c "
import csv,sys
rows=[r for r in csv.reader(open('/tmp/n.csv')) if len(r)>14 and r[0]!='ID']
for r in rows: print(r[0], r[4][:50], r[12], r[14])
" | head -80
  cp /tmp/n.csv $OUT/ncu_$(echo $v | tr ',=' '__').csv
done
