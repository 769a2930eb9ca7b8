#!/usr/bin/env python3
"""One call of our DSA backward and one of cuDNN-frontend's, on anchors.py's tensors, inside a
cudaProfilerStart / Stop range each, for Nsight Compute (issue 33: the H 64 / 128 gap):

    ncu --profile-from-start off --set full -o OUT/dsa_bwd \
        python3 bench/micro/dsa_bwd_profile.py --lib build/libsparse_attention.so [--H 64]

Both run three warm-up calls first (cuDNN-FE compiles on its first). Without cuDNN-FE's wheels
only ours is profiled.
"""
from __future__ import annotations

import argparse
import math

from ncu_range import load_library, profile

ap = argparse.ArgumentParser()
ap.add_argument("--lib", required=True)
ap.add_argument("--S", type=int, default=4096)
ap.add_argument("--H", type=int, default=64)
ap.add_argument("--Dqk", type=int, default=576)
ap.add_argument("--topk", type=int, default=2048)
ARGS = ap.parse_args()
OPS = load_library(ARGS.lib)

import torch  # noqa: E402

DEV = torch.device("cuda")


def main():
    S, H, Dqk, topk, Dv = ARGS.S, ARGS.H, ARGS.Dqk, ARGS.topk, 512
    g = torch.Generator(device=DEV).manual_seed(0)
    q = torch.randn(S, H, Dqk, device=DEV, dtype=torch.bfloat16, generator=g)
    kv = torch.randn(S, Dqk, device=DEV, dtype=torch.bfloat16, generator=g)
    do = torch.randn(S, H, Dv, device=DEV, dtype=torch.bfloat16, generator=g)
    idx = torch.stack([torch.randperm(S, device=DEV, generator=g)[:topk] for _ in range(S)])
    idx = idx.to(torch.int32).contiguous()
    sink = torch.rand(H, device=DEV, generator=g, dtype=torch.float32)
    scale = 1.0 / math.sqrt(Dqk)
    out, lse = OPS.dsa_fwd(q, kv, idx, None, sink, Dv, scale, False)

    def ours():
        return OPS.dsa_bwd(do, q, kv, out, lse, idx, None, sink, Dv, scale, False)

    subjects = [("ours", ours)]
    try:
        import cudnn
        dq_c, dkv_c = torch.empty_like(q), torch.empty_like(kv)

        def theirs():
            return cudnn.DSA.sparse_attention_backward_wrapper(
                q, kv, out, do, lse, sink, idx, softmax_scale=scale, topk_length=None,
                dq=dq_c, dkv=dkv_c)
        subjects.append(("cudnn_fe", theirs))
    except Exception as e:  # noqa: BLE001
        print(f"cuDNN-frontend unavailable: {type(e).__name__}: {e}", flush=True)
    profile(subjects)


main()
