#!/usr/bin/env bash
# Session 23, call 6: which ncu counters see wgmma's shared-memory operand reads (wgmma_rate),
# and the same counters on the block-128 backward (main, early S).
cd "$(dirname "$0")/.."
tar xJf build-ref/carry.tar.xz
M=l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed
timeout 150 ncu --metrics $M --kernel-name regex:wgmma_rate --launch-count 20 ./build-ref/wgmma_rate > $OUT/ncu_micro.txt 2>&1
H="--batch 1 --heads 32 --kv-heads 32 --seq 8192 --dim 128"
timeout 200 ncu --metrics $M --kernel-name regex:bsa_backward_sm90 --launch-skip 3 --launch-count 1 \
  ./build/sparse-attention bench --op bsa_bwd $H --block 128 --density 0.5 --variants impl=sm90 \
  --rounds 1 --calls 2 --warmup 1 > $OUT/ncu_bwd.txt 2>&1
grep -E "wgmma_rate|bsa_backward|pct|SS |RS " $OUT/ncu_micro.txt | cut -c1-150 | head -80
grep -E "bsa_backward|pct" $OUT/ncu_bwd.txt | cut -c1-150 | head -20
