#!/usr/bin/env python3
"""Where the Python harness's BSA times differ from the CLI's (docs/performance.md, "The CLI and
anchors.py"): our forward / backward through the package's ops, on one shape, in every
combination of
  data   randn (anchors.py) | uniform in [-1, 1] (the CLI)
  order  each row's blocks sorted (anchors.py, cuDNN-FE's examples) | random (the CLI)
  timing eager calls (anchors.py) | the same calls replayed from a CUDA graph (no host cost)
and, for the eager calls, the kernels' own durations from torch.profiler. Variants alternate round
by round (BENCHMARKING.md); the median round is printed and written as JSON.

    python3 bench/micro/bsa_harness.py --lib build/libsparse_attention.so --out OUT \
        [--block 128] [--density 0.125,0.5] [--ops fwd,bwd]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ap = argparse.ArgumentParser()
ap.add_argument("--lib", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--block", type=int, default=128)
ap.add_argument("--density", default="0.125,0.5")
ap.add_argument("--ops", default="fwd,bwd")
ap.add_argument("--B", type=int, default=1)
ap.add_argument("--H", type=int, default=32)
ap.add_argument("--S", type=int, default=8192)
ap.add_argument("--D", type=int, default=128)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--calls", type=int, default=20)
ARGS = ap.parse_args()
os.environ["SPARSE_ATTENTION_LIBRARY"] = str(Path(ARGS.lib).resolve())
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import sparse_attention  # noqa: E402,F401
import _timing  # noqa: E402

OPS = torch.ops.sparse_attention
DEV = torch.device("cuda")


def inputs(data, order, block, density, seed=0):
    B, H, S, D = ARGS.B, ARGS.H, ARGS.S, ARGS.D
    g = torch.Generator(device=DEV).manual_seed(seed)
    if data == "randn":
        t = [torch.randn(B, H, S, D, device=DEV, dtype=torch.bfloat16, generator=g)
             for _ in range(4)]
    else:
        t = [(torch.rand(B, H, S, D, device=DEV, generator=g) * 2 - 1).to(torch.bfloat16)
             for _ in range(4)]
    N = S // block
    count = max(1, round(density * N))
    idx = torch.rand(B, H, N, N, device=DEV, generator=g).argsort(-1)[..., :count]
    if order == "sorted":
        idx = idx.sort(-1).values
    return (*t, idx.to(torch.int32).contiguous(), count)


def graphed(fn, calls):
    """A CUDA graph of `calls` calls of fn; returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g.replay


def main():
    block, D = ARGS.block, ARGS.D
    scale = 1.0 / math.sqrt(D)
    records = []
    for density in [float(x) for x in ARGS.density.split(",")]:
        for op in ARGS.ops.split(","):
            fns, labels = [], []
            for data in ("randn", "uniform"):
                for order in ("sorted", "random"):
                    q, k, v, do, idx, count = inputs(data, order, block, density)
                    o, lse = OPS.bsa_fwd(q, k, v, idx, None, None, block, 0, -1, scale, 0,
                                         False, False)
                    if op == "fwd":
                        def fn(q=q, k=k, v=v, idx=idx):
                            return OPS.bsa_fwd(q, k, v, idx, None, None, block, 0, -1, scale, 0,
                                               False, False)
                    else:
                        def fn(q=q, k=k, v=v, idx=idx, o=o, lse=lse, do=do):
                            return OPS.bsa_bwd(do, q, k, v, o, lse, idx, None, None, block, 0,
                                               -1, scale, 0, False, False)
                    r = fn()
                    torch.cuda.synchronize()
                    assert not any(torch.isnan(x).any() for x in r), "NaN"
                    fns.append(fn)
                    labels.append((data, order, "eager"))
                    gcalls = ARGS.calls
                    fns.append(graphed(fn, gcalls))
                    labels.append((data, order, "graph"))
            # Each graph replay runs ARGS.calls calls: time it with 1 "call" per round.
            calls = [1 if lab[2] == "graph" else ARGS.calls for lab in labels]
            for f in fns:
                f()
            torch.cuda.synchronize()
            rounds = [[] for _ in fns]
            for p in range(2):
                seq = list(range(len(fns)))
                if p == 1:
                    seq.reverse()
                for _ in range(ARGS.rounds):
                    for i in seq:
                        ms = _timing.round_ms(fns[i], calls[i])
                        if labels[i][2] == "graph":
                            ms /= ARGS.calls
                        rounds[i].append(ms)
            N = ARGS.S // block
            count = max(1, round(density * N))
            flops = 4.0 * ARGS.B * ARGS.H * N * block * count * block * D
            if op == "bwd":
                flops *= 2.5
            for i, lab in enumerate(labels):
                med = _timing.median(rounds[i])
                rec = {"op": "bsa_" + op, "block": block, "density": density, "data": lab[0],
                       "order": lab[1], "timing": lab[2], "ms": round(med, 5),
                       "tflops": round(flops / med / 1e9, 1)}
                if lab[2] == "eager":
                    ms, top = _timing.kernel_ms(fns[i], calls=20)
                    rec["kernel_ms"] = round(ms, 5)
                    rec["kernels"] = top
                records.append(rec)
                print(json.dumps(rec), flush=True)
    Path(ARGS.out).mkdir(parents=True, exist_ok=True)
    (Path(ARGS.out) / "bsa_harness.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "records": records}, indent=1))


main()
