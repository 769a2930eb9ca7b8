"""Timing pieces the bench scripts share (bench/anchors.py, bench/cp_overlap.py): one round of
calls timed with CUDA events (wall clock on the CPU), and the median of the rounds."""
import time

import torch


def round_ms(fn, calls: int, cuda: bool = True) -> float:
    """Milliseconds per call of `calls` back-to-back calls of fn."""
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def median(t) -> float:
    t = sorted(t)
    n = len(t)
    return t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])
