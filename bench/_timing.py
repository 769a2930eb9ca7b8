"""Timing pieces the bench scripts share (bench/anchors.py, bench/cp_overlap.py,
bench/micro/bsa_harness.py): one round of calls timed with CUDA events (wall clock on the CPU),
the median of the rounds, and the GPU time of the kernels a call launches (torch.profiler)."""
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


def kernel_ms(fn, calls: int = 10, top: int = 4):
    """(GPU ms per call of the kernels, memsets and copies fn launches, [(name, us per call)] of
    the `top` longest), from torch.profiler: the call's device time without the gaps between
    kernels that round_ms includes."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total, names = 0.0, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            dt = e.time_range.elapsed_us()
            total += dt
            names[e.name[:60]] = names.get(e.name[:60], 0.0) + dt
    longest = sorted(names.items(), key=lambda kv: -kv[1])[:top]
    return total / calls / 1e3, [(k, round(v / calls, 1)) for k, v in longest]

