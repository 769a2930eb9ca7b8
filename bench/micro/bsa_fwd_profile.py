#!/usr/bin/env python3
"""One call of our Hopper BSA forward and one of cuDNN-frontend's, on anchors.py's tensors (B 1,
H 32, D 128, randn bf16, sorted random block lists), inside a cudaProfilerStart / Stop range each,
for Nsight Compute (issue 33: the block-64 forward gap):

    ncu --profile-from-start off --set full -o OUT/bsa_fwd \
        python3 bench/micro/bsa_fwd_profile.py --lib build/libsparse_attention.so [--block 64]

Both run three warm-up calls first (cuDNN-FE compiles on its first). Without cuDNN-FE's wheels
only ours is profiled.
"""
from __future__ import annotations

import argparse
import math

from ncu_range import load_library, profile

ap = argparse.ArgumentParser()
ap.add_argument("--lib", required=True)
ap.add_argument("--S", type=int, default=8192)
ap.add_argument("--H", type=int, default=32)
ap.add_argument("--block", type=int, default=64)
ap.add_argument("--density", type=float, default=0.5)
ARGS = ap.parse_args()
OPS = load_library(ARGS.lib)

import torch  # noqa: E402

DEV = torch.device("cuda")


def main():
    S, H, D, block = ARGS.S, ARGS.H, 128, ARGS.block
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D, device=DEV, dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    n = math.ceil(S / block)
    count = max(1, round(ARGS.density * n))
    idx = torch.rand(1, H, n, n, device=DEV, generator=g).argsort(-1)[..., :count]
    idx = idx.sort(-1).values.to(torch.int32).contiguous()
    scale = 1.0 / math.sqrt(D)

    def ours():
        return OPS.bsa_fwd(q, k, v, idx, None, None, block, 0, -1, scale, 0, False, False)

    subjects = [("ours", ours)]
    try:
        import cudnn

        def theirs():
            return cudnn.block_sparse_attention_forward(
                q, k, v, idx, block_sparse_num=count, sparse_block_size=block,
                softmax_scale=scale)
        subjects.append(("cudnn_fe", theirs))
    except Exception as e:  # noqa: BLE001
        print(f"cuDNN-frontend unavailable: {type(e).__name__}: {e}", flush=True)
    profile(subjects)


main()
