#!/usr/bin/env python3
"""Our kernels beside the anchors of BENCHMARKING.md, in one process, on the same inputs.

Runs on the GPU machine (its python3 has PyTorch): our library through the Python package's
custom ops (the C ABI via ctypes, on the current stream), FlexAttention (torch.compile'd, the same
block lists as a BlockMask of full blocks), dense cuDNN attention at the same shape (the ceiling
per useful FLOP) and, for DSA, a PyTorch gather-and-softmax implementation chunked over queries.

Method (BENCHMARKING.md): CUDA events; 10 warm-up calls; rounds of 20 calls; ours and the anchor
alternate round by round, 5 rounds each, then a second pass in reverse order; the median round.
"Ours" is each implementation of --impls (default: the dispatcher's choice and the portable path
forced, timed once when they coincide), all in the same pairing as the anchor.
Before timing, our outputs are poisoned with NaN by running into fresh tensors and checked for
NaN, and compared with the anchor's outputs (rel L2) — the fp64 reference comparison is done by
the C++ suite and `sparse-attention bench`.

    python3 bench/anchors.py --lib build/libsparse_attention.so --out OUT [--quick]

Writes OUT/anchors.json (records as BENCHMARKING.md "Results files" says) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libsparse_attention.so to load")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="one shape per op")
    ap.add_argument("--ops", default="bsa_fwd,bsa_bwd,dsa_fwd,dsa_bwd")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new shape after this many seconds")
    ap.add_argument("--impls", default="auto,portable",
                    help="our implementations to time beside each anchor (auto, portable, sm90); "
                         "one that resolves to an implementation already listed is timed once")
    return ap.parse_args()


ARGS = parse()
os.environ["SPARSE_ATTENTION_LIBRARY"] = str(Path(ARGS.lib).resolve())
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sparse_attention  # noqa: E402,F401  (registers torch.ops.sparse_attention.*)
from sparse_attention import _abi  # noqa: E402

OPS = torch.ops.sparse_attention
DEV = torch.device("cuda")
RECORDS = []


# ---- timing -------------------------------------------------------------------------------------
def _round_ms(fn, calls):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def paired(fns):
    """Median ms of each callable: warm-up, then alternating rounds, second pass reversed.

    A slow anchor (the PyTorch gather DSA takes ~0.1-0.3 s a call) gets fewer warm-up calls and
    fewer calls per round (at least 3), so that a round stays near 0.2 s: its median is still
    far more precise than the ratio it feeds, and the device time of a run stays bounded."""
    calls = []
    for fn in fns:
        fn()
        torch.cuda.synchronize()
        single = _round_ms(fn, 1)
        n = ARGS.calls if single * ARGS.calls <= 200 else max(3, int(200 / max(single, 1e-3)))
        calls.append(n)
        for _ in range(ARGS.warmup if n == ARGS.calls else 2):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for order in (range(len(fns)), reversed(range(len(fns)))):
        order = list(order)
        for _ in range(ARGS.rounds):
            for i in order:
                times[i].append(_round_ms(fns[i], calls[i]))
    med = []
    for t in times:
        t = sorted(t)
        n = len(t)
        med.append(t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2]))
    spread = [(min(t), max(t)) for t in times]
    return med, spread


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def record(op, shape, ours_ms, flops, anchor, anchor_ms, err, impl, spread):
    r = {
        "op": op, "impl": impl, "shape": shape, "ms": round(ours_ms, 5),
        "tflops": round(flops / (ours_ms * 1e-3) / 1e12, 1), "anchor": anchor,
        "anchor_ms": None if anchor_ms is None else round(anchor_ms, 5),
        "speedup": None if anchor_ms is None else round(anchor_ms / ours_ms, 3),
        # err: our outputs vs the anchor's on the same inputs (None for dense, another function).
        "correct": bool(err is None or err < 1e-2), "max_rel_l2": err,
        "ms_spread": [round(spread[0], 5), round(spread[1], 5)],
        "source": "bench/anchors.py", "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    RECORDS.append(r)
    # Written after every record: a run cut short by its time limit keeps what it measured.
    (Path(ARGS.out) / "anchors.json").write_text(json.dumps(RECORDS, indent=1) + "\n")
    anchor_txt = "-" if anchor_ms is None else f"{anchor_ms:8.4f} ms"
    speed_txt = "-" if anchor_ms is None else f"{r['speedup']:.2f}x"
    err_txt = "-" if err is None else f"{err:.2e}"
    print(f"  {op:8s} vs {anchor:12s} ours {ours_ms:8.4f} ms {r['tflops']:7.1f} TFLOPS | "
          f"anchor {anchor_txt} | speedup {speed_txt} | rel L2 vs anchor {err_txt}", flush=True)


def impl_name():
    """Which implementation served our last call (the package records sa_context.impl_used)."""
    return getattr(_abi, "LAST_IMPL_NAME", None) or "auto"


_FORCE = "SPARSE_ATTENTION_FORCE_IMPL"


def ours_variants(fn):
    """[(implementation name, callable)] for --impls: `fn` with the package's implementation
    pinned (auto: the dispatcher's choice), each implementation once, in --impls order."""
    out, seen = [], set()
    for impl in ARGS.impls.split(","):
        def call(impl=impl):
            if impl == "auto":
                os.environ.pop(_FORCE, None)
            else:
                os.environ[_FORCE] = impl
            try:
                return fn()
            finally:
                os.environ.pop(_FORCE, None)
        try:
            call()
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            print(f"  impl {impl} unavailable: {str(e)[:160]}")
            continue
        name = impl_name()
        if name not in seen:
            seen.add(name)
            out.append((name, call))
    return out


def paired_record(op, shape, flops, ours, anchor, anchor_fn, errs):
    """Our implementations and one anchor in one pairing (alternating rounds); one record each."""
    meds, spreads = paired([f for _, f in ours] + [anchor_fn])
    for (impl, _), ms, sp, err in zip(ours, meds, spreads, errs):
        record(op, shape, ms, flops, anchor, meds[-1], err, impl, sp)


# ---- BSA ----------------------------------------------------------------------------------------
def bsa_inputs(B, H, S, D, block, density, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, S, D, device=DEV, dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    N = math.ceil(S / block)
    count = max(1, round(density * N))
    idx = torch.rand(B, H, N, N, device=DEV, generator=g).argsort(-1)[..., :count]
    idx = idx.sort(-1).values.to(torch.int32).contiguous()
    return q, k, v, do, idx, count


def bsa_flops(B, H, S, D, block, count):
    # All blocks full (S a multiple of block): 4 * q_tokens * kv_tokens * D per (b, h, m).
    N = S // block
    return 4.0 * B * H * N * block * (count * block) * D


def flex_block_mask(idx, S, block):
    from torch.nn.attention.flex_attention import BlockMask
    B, H, N, count = idx.shape
    zeros = torch.zeros(B, H, N, dtype=torch.int32, device=DEV)
    full_num = torch.full((B, H, N), count, dtype=torch.int32, device=DEV)
    pad = torch.zeros(B, H, N, N, dtype=torch.int32, device=DEV)
    full_idx = pad.clone()
    full_idx[..., :count] = idx
    return BlockMask.from_kv_blocks(zeros, pad, full_num, full_idx, BLOCK_SIZE=block,
                                    seq_lengths=(S, S))


def bench_bsa(B, H, S, D, block, density, ops, seed=0):
    q, k, v, do, idx, count = bsa_inputs(B, H, S, D, block, density, seed)
    shape = {"B": B, "H": H, "H_kv": H, "S": S, "D": D, "block": block,
             "density": round(count / (S // block), 4)}
    print(f"[bsa] {shape}", flush=True)
    flops = bsa_flops(B, H, S, D, block, count)
    scale = 1.0 / math.sqrt(D)

    def ours_fwd():
        return OPS.bsa_fwd(q, k, v, idx, None, None, block, 0, -1, scale, 0, False, False)

    o, lse = ours_fwd()
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "NaN in our forward"

    def ours_bwd():
        return OPS.bsa_bwd(do, q, k, v, o, lse, idx, None, None, block, 0, -1, scale, 0,
                           False, False)

    # Anchors: FlexAttention (same block lists) and dense cuDNN SDPA.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention)
    anchors = {}
    try:
        bm = flex_block_mask(idx, S, block)
        anchors["flex"] = lambda: flex(q, k, v, block_mask=bm, scale=scale)
        anchors["flex"]()
    except Exception as e:  # noqa: BLE001
        print(f"  flex forward unavailable: {type(e).__name__}: {str(e)[:200]}")
        anchors.pop("flex", None)

    def dense():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale)
    anchors["cudnn_dense"] = dense

    if "bsa_fwd" in ops:
        ours = ours_variants(ours_fwd)
        for name, fn in anchors.items():
            # Dense attention computes another function: no output comparison against it.
            ref = fn() if name == "flex" else None
            errs = [None if ref is None else rel_l2(f()[0], ref) for _, f in ours]
            paired_record("bsa_fwd", shape, flops, ours, name, fn, errs)
    if "bsa_bwd" in ops:
        try:
            dq, dk, dv = ours_bwd()
            torch.cuda.synchronize()
        except NotImplementedError as e:
            print(f"  our backward unavailable: {str(e)[:200]}")
            return
        for name, fn in anchors.items():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            try:
                if name == "flex":
                    out = flex(qq, kk, vv, block_mask=bm, scale=scale)
                else:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        out = F.scaled_dot_product_attention(qq, kk, vv, scale=scale)

                def anchor_bwd():
                    return torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
                adq, adk, adv = anchor_bwd()
            except Exception as e:  # noqa: BLE001
                print(f"  {name} backward unavailable: {type(e).__name__}: {str(e)[:200]}")
                continue
            ours = ours_variants(ours_bwd)
            errs = []
            for _, f in ours:
                g = f()
                errs.append(max(rel_l2(g[0], adq), rel_l2(g[1], adk), rel_l2(g[2], adv))
                            if name == "flex" else None)
            paired_record("bsa_bwd", shape, 2.5 * flops, ours, name, anchor_bwd, errs)


# ---- DSA ----------------------------------------------------------------------------------------
def gather_dsa(q, kv, idx, sink, scale, d_v, chunk=256):
    """The baseline a user writes: gather the selected rows, masked softmax with a sink."""
    outs = []
    S_kv = kv.shape[0]
    for s0 in range(0, q.shape[0], chunk):
        qi = q[s0:s0 + chunk]                               # [c, H, D]
        ii = idx[s0:s0 + chunk]                             # [c, topk]
        valid = (ii >= 0) & (ii < S_kv)
        kk = kv[ii.clamp(0, S_kv - 1)]                      # [c, topk, D]
        s = torch.einsum("chd,ctd->cht", qi.float(), kk.float()) * scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        lse = torch.logsumexp(s, -1)                        # [c, H]
        L = torch.logaddexp(lse, sink[None, :])
        p = torch.exp(s - L[..., None])
        outs.append(torch.einsum("cht,ctd->chd", p, kk[..., :d_v].float()).to(q.dtype))
    return torch.cat(outs)


def bench_dsa(S, H, Dqk, topk, ops, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    Dv = 512
    q = torch.randn(S, H, Dqk, device=DEV, dtype=torch.bfloat16, generator=g)
    kv = torch.randn(S, Dqk, device=DEV, dtype=torch.bfloat16, generator=g)
    do = torch.randn(S, H, Dv, device=DEV, dtype=torch.bfloat16, generator=g)
    idx = torch.stack([torch.randperm(S, device=DEV, generator=g)[:topk] for _ in range(S)])
    idx = idx.to(torch.int32).contiguous()
    sink = torch.rand(H, device=DEV, generator=g, dtype=torch.float32)
    scale = 1.0 / math.sqrt(Dqk)
    shape = {"S": S, "H": H, "D_qk": Dqk, "topk": topk, "topk_length": False}
    print(f"[dsa] {shape}", flush=True)
    pairs = S * H * topk

    def ours_fwd():
        return OPS.dsa_fwd(q, kv, idx, None, sink, Dv, scale, False)

    out, lse = ours_fwd()
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "NaN in our forward"
    anchor_fwd = lambda: gather_dsa(q, kv, idx, sink, scale, Dv)  # noqa: E731
    if "dsa_fwd" in ops:
        ref = anchor_fwd()
        ours = ours_variants(ours_fwd)
        errs = [rel_l2(f()[0], ref) for _, f in ours]
        paired_record("dsa_fwd", shape, 2.0 * pairs * (Dqk + Dv), ours, "torch_gather",
                      anchor_fwd, errs)
    if "dsa_bwd" in ops:
        def ours_bwd():
            return OPS.dsa_bwd(do, q, kv, out, lse, idx, None, sink, Dv, scale, False)
        try:
            dq, dkv, dsink = ours_bwd()
            torch.cuda.synchronize()
        except NotImplementedError as e:
            print(f"  our backward unavailable: {str(e)[:200]}")
            return
        qq, kk, ss = (t.detach().requires_grad_() for t in (q, kv, sink))
        ref = gather_dsa(qq, kk, idx, ss, scale, Dv)

        def anchor_bwd():
            return torch.autograd.grad(ref, (qq, kk, ss), do, retain_graph=True)
        adq, adkv, adsink = anchor_bwd()
        ours = ours_variants(ours_bwd)
        errs = []
        for _, f in ours:
            g = f()
            errs.append(max(rel_l2(g[0], adq), rel_l2(g[1], adkv), rel_l2(g[2], adsink)))
        paired_record("dsa_bwd", shape, 2.0 * pairs * (3 * Dqk + 2 * Dv), ours, "torch_gather",
                      anchor_bwd, errs)


def main():
    ops = set(ARGS.ops.split(","))
    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    bsa_ops = ops & {"bsa_fwd", "bsa_bwd"}
    dsa_ops = ops & {"dsa_fwd", "dsa_bwd"}
    # Headline shapes first, so that a run cut short by --budget-s keeps the most important ones.
    plan = []
    if bsa_ops:
        plan += [("bsa", (1, 32, 8192, 128, 128, d)) for d in (0.5, 0.25, 0.125)]
    if dsa_ops:
        plan += [("dsa", (4096, 128, 576, 2048)), ("dsa", (4096, 64, 576, 2048))]
    if bsa_ops:
        plan += [("bsa", (1, 32, 8192, 128, 64, d)) for d in (0.5, 0.25, 0.125)]
        plan += [("bsa", (1, 32, 32768, 128, 128, 0.5))]
    if dsa_ops:
        plan += [("dsa", (4096, 128, 512, 2048)), ("dsa", (4096, 64, 512, 2048))]
    if ARGS.quick:
        plan = plan[:1] + [p for p in plan if p[0] == "dsa"][:1]
    for kind, shape in plan:
        if time.time() - t0 > ARGS.budget_s:
            print(f"budget of {ARGS.budget_s} s spent: skipping {kind} {shape}")
            continue
        if kind == "bsa":
            bench_bsa(*shape, bsa_ops)
        else:
            bench_dsa(*shape, dsa_ops)
        torch.cuda.empty_cache()
    (out / "anchors.json").write_text(json.dumps(RECORDS, indent=1) + "\n")
    print(f"wrote {len(RECORDS)} records to {out / 'anchors.json'} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
