#!/usr/bin/env python3
"""What context parallelism costs on one GPU (issue 36): ``sparse_attention.distributed`` at world
size 1 beside the single-device operations, in one process.

One process joins an NCCL process group of world size 1 (a file:// store in a temporary
directory; NCCL_NVLS_ENABLE=0) and times, on the same inputs, forward + backward (the top-k:
forward only) in these modes:

  single       the single-device op (``sparse_attention.<op>``);
  cp           ``sparse_attention.distributed.<op>`` as shipped: at world 1 it skips the key
               gather and the gradients' reduce-scatter (nothing to move) and keeps the
               exchange of the shard sizes (a small all-gather and a host synchronisation);
  cp_sizes     cp with ``shard_sizes`` given (a static split: no size exchange, no host
               synchronisation);
  cp_issued    the same as cp with every collective issued anyway (the module's benchmark switch
               ``_ISSUE_AT_WORLD_1``): the keys' all-gather on NCCL's stream, their
               concatenation, and in the backward the fp32 reduce-scatter of the key gradients;
  cp_prefetch  cp_issued with the keys passed as a ``PendingRows`` from
               ``all_gather_rows_async`` started one call ahead (each call starts the next call's
               gather, then computes on the one started before: a layer's keys in flight during
               the previous layer), against cp_issued's synchronous gather.

plus a ``collectives`` op: the size exchange alone, and the issued gather of the keys with its
reduce-scatter (forward + backward of ``all_gather_rows``) alone, in absolute time.

ratio_vs_single = ms / ms(single) of the same op and shape: the overhead of the collectives,
padding and copies at world 1 (ideally 1.00), and whether the prefetch hides the gather
(cp_prefetch <= cp_issued). Before timing, every mode's outputs and gradients are compared with
the single-device call (``max_rel_l2_vs_single``; not bitwise on a GPU: the key gradients are
summed with atomics).

Method (as bench/anchors.py): CUDA events around rounds of calls; warm-up calls; the modes
alternate round by round, ``--rounds`` rounds each, then a second pass in reverse order; the
median round. Every mode of a row runs the same number of calls per round (chosen so that the
single-device round takes about --round-ms).

    SPARSE_ATTENTION_LIBRARY=build/libsparse_attention.so PYTHONPATH=python \\
        python3 bench/cp_overlap.py --out OUT            # one GPU, NCCL
    python3 bench/cp_overlap.py --smoke --out OUT        # tiny shapes on the CPU, gloo

Writes OUT/cp_overlap.json (a list of records {op, shape, mode, ms, ratio_vs_single, ...}) and
prints a table. Several GPUs (the scaling) are not measured here.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("single", "cp", "cp_sizes", "cp_issued", "cp_prefetch")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lib", default=None,
                    help="libsparse_attention.so (default: $SPARSE_ATTENTION_LIBRARY)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU with gloo (world 1): exercises every path")
    ap.add_argument("--ops", default="collectives,dsa,indexer_topk,indexer_loss,bsa")
    ap.add_argument("--dsa-s", default="8192,32768", help="DSA sequence lengths (H 128, "
                    "D_qk 576, d_v 512, topk 2048, random distinct keys per row)")
    ap.add_argument("--bsa-s", default="8192,32768", help="BSA sequence lengths (B 1, H 32, "
                    "D 128, block 128, half the KV blocks per query block)")
    ap.add_argument("--indexer-s", default="8192,32768", help="indexer top-k sequence lengths "
                    "(H_I 64, D_I 128, topk 2048, causal ranges)")
    ap.add_argument("--loss-s", default="8192", help="indexer loss (sparse mode) sequence "
                    "lengths (H_I 64, D_I 128, attention H 128, D_qk 576, topk 2048, causal)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--round-ms", type=float, default=250.0,
                    help="target length of a single-device round (calls per round: 2 to 50)")
    return ap.parse_args(argv)


ARGS = parse()
if ARGS.lib:
    os.environ["SPARSE_ATTENTION_LIBRARY"] = str(Path(ARGS.lib).resolve())
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sparse_attention as sa  # noqa: E402
from sparse_attention import distributed as cp  # noqa: E402

import _timing  # noqa: E402  (bench/_timing.py, beside this script)

SMOKE = ARGS.smoke
DEV = torch.device("cpu" if SMOKE else "cuda")
DTYPE = torch.float32 if SMOKE else torch.bfloat16
RECORDS = []
GROUP = None


# ---- timing ------------------------------------------------------------------------------------
def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def round_ms(fn, calls):
    return _timing.round_ms(fn, calls, cuda=DEV.type == "cuda")


def paired(fns):
    """{mode: median ms per call, (min, max) round}, calls per round: warm-up, then the modes
    alternate round by round, a second pass in reverse order."""
    names = list(fns)
    for name in names:
        for _ in range(max(1, ARGS.warmup)):
            fns[name]()
    sync()
    one = round_ms(fns[names[0]], 1)
    calls = 2 if SMOKE else int(min(50, max(2, ARGS.round_ms / max(one, 1e-3))))
    times = {name: [] for name in names}
    for order in (names, names[::-1]):
        for _ in range(ARGS.rounds):
            for name in order:
                times[name].append(round_ms(fns[name], calls))
    return {n: (_timing.median(t), (min(t), max(t))) for n, t in times.items()}, calls


def rel_l2(a, b):
    """||a - b|| / ||b|| in fp64, in slices (the DSA outputs at S 32768 are 2^31 values)."""
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    num = den = 0.0
    for i in range(0, b.numel(), 1 << 26):
        x, y = a[i:i + (1 << 26)].double(), b[i:i + (1 << 26)].double()
        num += (x - y).square().sum().item()
        den += y.square().sum().item()
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def report(op, shape, fns, check=None):
    """Checks every mode against 'single' (check: mode fn -> tuple of tensors), times them and
    appends the records."""
    errs = {}
    if check is not None:
        want = check(fns["single"])
        for name, fn in fns.items():
            errs[name] = max(rel_l2(g, w) for g, w in zip(check(fn), want))
        del want
    res, calls = paired(fns)
    base = res["single"][0] if "single" in res else None
    for name, (ms, spread) in res.items():
        r = {"op": op, "shape": shape, "mode": name, "ms": round(ms, 4),
             "ratio_vs_single": None if base is None else round(ms / base, 4),
             "delta_ms_vs_single": None if base is None else round(ms - base, 4),
             "spread_ms": [round(spread[0], 4), round(spread[1], 4)],
             "calls_per_round": calls, "rounds": 2 * ARGS.rounds,
             "max_rel_l2_vs_single": errs.get(name), "device": DEVICE_NAME,
             "backend": dist.get_backend(GROUP)}
        RECORDS.append(r)
        print(row(r), flush=True)


def row(r):
    ratio = "" if r["ratio_vs_single"] is None else "%.4f" % r["ratio_vs_single"]
    err = "" if r["max_rel_l2_vs_single"] is None else "%.1e" % r["max_rel_l2_vs_single"]
    shape = " ".join("%s=%s" % kv for kv in r["shape"].items())
    return "%-13s %-52s %-12s %10.4f %8s %9s" % (r["op"], shape, r["mode"], r["ms"], ratio, err)


@contextlib.contextmanager
def issued():
    """The collectives issued at world 1 (the gather, its copies, the reduce-scatter)."""
    old = cp._ISSUE_AT_WORLD_1
    cp._ISSUE_AT_WORLD_1 = True
    try:
        yield
    finally:
        cp._ISSUE_AT_WORLD_1 = old


def modes(run, keys):
    """The four modes of one op. run(impl, keys) does one call: impl is sparse_attention or
    a wrapper of sparse_attention.distributed (group bound); keys the key tensors (or their
    PendingRows). keys: (tensor, dim) of the keys the distributed op gathers."""
    sizes = [[t.shape[d]] for t, d in keys]  # world 1: every rank's rows = ours
    ahead = []

    def start():
        return [cp.all_gather_rows_async(t, d, GROUP, s) for (t, d), s in zip(keys, sizes)]

    def prefetch():
        with issued():
            if not ahead:
                ahead.append(start())
            cur = ahead.pop()
            ahead.append(start())  # the next call's keys move while this call computes
            return run(DIST, cur)

    def cp_issued():
        with issued():
            return run(DIST, [t for t, _ in keys])

    sized = _Dist(shard_sizes=[keys[0][0].shape[keys[0][1]]])  # world 1: this rank's rows
    return {"single": lambda: run(sa, [t for t, _ in keys]),
            "cp": lambda: run(DIST, [t for t, _ in keys]),
            "cp_sizes": lambda: run(sized, [t for t, _ in keys]),
            "cp_issued": cp_issued, "cp_prefetch": prefetch}, ahead


def drain(ahead):
    for pending in ahead:
        for p in pending:
            p.wait()
    ahead.clear()


class _Dist:
    """sparse_attention.distributed's ops with the group (and any other keywords) bound."""

    def __init__(self, **bound):
        self._bound = bound

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        fn = getattr(cp, name)
        return lambda *a, **k: fn(*a, group=GROUP, **self._bound, **k)


DIST = _Dist()


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def randn(*shape, g, dtype=None):
    return torch.randn(*shape, device=DEV, generator=g).to(dtype or DTYPE)


def random_topk(s_q, s_kv, topk, g):
    """[s_q, topk] int32: distinct random keys per row, ascending (in row chunks: the [rows,
    s_kv] random matrix stays ~0.5 GB)."""
    rows = max(1, (1 << 27) // s_kv)
    parts = [torch.rand(min(rows, s_q - r), s_kv, device=DEV, generator=g).topk(topk).indices
             for r in range(0, s_q, rows)]
    return torch.cat(parts).sort(-1).values.to(torch.int32).contiguous()


# ---- the ops -----------------------------------------------------------------------------------
def bench_collectives(S, D):
    """The size exchange alone, and the issued gather + reduce-scatter of [S, D] keys alone."""
    g = gen(0)
    kv = randn(S, D, g=g).requires_grad_()
    dfull = randn(S, D, g=g)
    shape = {"S": S, "D": D, "dtype": str(DTYPE).replace("torch.", "")}

    # The switch works: issued, the gathered keys are a new tensor; as shipped, the input.
    with issued():
        assert cp.all_gather_rows(kv, 0, GROUP, [S]).data_ptr() != kv.data_ptr()
    assert cp.all_gather_rows(kv, 0, GROUP, [S]).data_ptr() == kv.data_ptr()

    def exchange():
        return cp._exchange([S, S], DEV, GROUP)

    def gather():
        with issued():
            full = cp.all_gather_rows(kv, 0, GROUP, [S])
            return torch.autograd.grad(full, kv, dfull)

    report("collectives", shape, {"exchange": exchange, "gather_issued": gather})


def bench_dsa(S, H, Dqk, Dv, topk):
    g = gen(1)
    q = randn(S, H, Dqk, g=g).requires_grad_()
    kv = randn(S, Dqk, g=g).requires_grad_()
    do = randn(S, H, Dv, g=g)
    sink = torch.rand(H, device=DEV, generator=g).requires_grad_()
    idx = random_topk(S, S, topk, g)
    shape = {"S": S, "H": H, "D_qk": Dqk, "d_v": Dv, "topk": topk}

    def run(impl, keys):
        o, _ = impl.deepseek_sparse_attention(q, keys[0], idx, sink=sink, d_v=Dv)
        return (o.detach(),) + torch.autograd.grad(o, (q, kv, sink), do)

    fns, ahead = modes(run, [(kv, 0)])
    report("dsa", shape, fns, check=lambda fn: fn())
    drain(ahead)


def indexer_inputs(S, H_I, D_I, g):
    q_I = randn(S, H_I, D_I, g=g)
    k_I = randn(S, D_I, g=g)
    w = (torch.rand(S, H_I, device=DEV, generator=g) * 2 - 0.5).float()
    k_start = torch.zeros(S, dtype=torch.int32, device=DEV)
    k_end = torch.arange(1, S + 1, dtype=torch.int32, device=DEV)  # causal
    return q_I, k_I, w, k_start, k_end


def bench_indexer_topk(S, H_I, D_I, topk):
    q_I, k_I, w, k_start, k_end = indexer_inputs(S, H_I, D_I, gen(2))
    shape = {"S": S, "H_I": H_I, "D_I": D_I, "topk": topk, "causal": True}

    def run(impl, keys):
        return impl.indexer_topk(q_I, keys[0], w, topk, k_start, k_end)

    fns, ahead = modes(run, [(k_I, 0)])
    report("indexer_topk", shape, fns, check=lambda fn: tuple(t.float() for t in fn()))
    drain(ahead)


def bench_indexer_loss(S, H_I, D_I, H, Dqk, topk):
    g = gen(3)
    q_I, k_I, w, k_start, k_end = indexer_inputs(S, H_I, D_I, g)
    q, kv = randn(S, H, Dqk, g=g), randn(S, Dqk, g=g)
    with torch.no_grad():
        idx, length = sa.indexer_topk(q_I, k_I, w, topk, k_start, k_end)
        _, lse = sa.deepseek_sparse_attention(q, kv, idx, topk_length=length,
                                              d_v=min(512, Dqk))  # lse: any d_v
    leaves = [t.requires_grad_() for t in (q_I, k_I, w)]
    shape = {"S": S, "H_I": H_I, "D_I": D_I, "H": H, "D_qk": Dqk, "topk": topk,
             "causal": True}

    def run(impl, keys):
        loss = impl.indexer_kl_loss(q_I, keys[0], w, q, keys[1], lse, idx, length, k_start,
                                    k_end)
        return (loss.detach().reshape(1),) + torch.autograd.grad(loss, leaves)

    fns, ahead = modes(run, [(k_I, 0), (kv, 0)])
    report("indexer_loss", shape, fns, check=lambda fn: fn())
    drain(ahead)


def bench_bsa(B, H, S, D, block, density):
    g = gen(4)
    q, k, v = (randn(B, H, S, D, g=g).requires_grad_() for _ in range(3))
    do = randn(B, H, S, D, g=g)
    n = math.ceil(S / block)
    count = max(1, round(density * n))
    idx = torch.rand(B, H, n, n, device=DEV, generator=g).argsort(-1)[..., :count]
    idx = idx.sort(-1).values.to(torch.int32).contiguous()
    shape = {"B": B, "H": H, "S": S, "D": D, "block": block, "density": density}

    def run(impl, keys):
        o, _ = impl.block_sparse_attention(q, keys[0], keys[1], idx, block_size=block)
        return (o.detach(),) + torch.autograd.grad(o, (q, k, v), do)

    fns, ahead = modes(run, [(k, 2), (v, 2)])
    report("bsa", shape, fns, check=lambda fn: fn())
    drain(ahead)


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def plan():
    ops = set(ARGS.ops.split(","))
    if SMOKE:  # tiny shapes: every path, in a second or two on a CPU
        steps = [("collectives", (64, 32)), ("dsa", (64, 4, 32, 16, 8)),
                 ("indexer_topk", (64, 4, 16, 8)), ("indexer_loss", (64, 4, 16, 4, 32, 8)),
                 ("bsa", (1, 2, 128, 16, 64, 0.5))]
    else:
        steps = [("collectives", (S, 576)) for S in ints(ARGS.dsa_s)]
        steps += [("dsa", (S, 128, 576, 512, 2048)) for S in ints(ARGS.dsa_s)]
        steps += [("indexer_topk", (S, 64, 128, 2048)) for S in ints(ARGS.indexer_s)]
        steps += [("indexer_loss", (S, 64, 128, 128, 576, 2048)) for S in ints(ARGS.loss_s)]
        steps += [("bsa", (1, 32, S, 128, 128, 0.5)) for S in ints(ARGS.bsa_s)]
    return [s for s in steps if s[0] in ops]


BENCH = {"collectives": bench_collectives, "dsa": bench_dsa, "indexer_topk": bench_indexer_topk,
         "indexer_loss": bench_indexer_loss, "bsa": bench_bsa}


def main():
    global GROUP, DEVICE_NAME
    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    if DEV.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --smoke for the CPU (gloo) path")
        torch.cuda.set_device(0)
        DEVICE_NAME = torch.cuda.get_device_name(0)
    else:
        DEVICE_NAME = "cpu"
    backend = "gloo" if SMOKE else "nccl"
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group(backend, init_method="file://" + os.path.join(d, "store"),
                                rank=0, world_size=1)
        GROUP = dist.group.WORLD
        try:
            print("%s, %s world 1, sparse_attention %s (%s)" % (
                DEVICE_NAME, backend, sa.__version__, sa.library_path))
            print("%-13s %-52s %-12s %10s %8s %9s" % ("op", "shape", "mode", "ms", "ratio",
                                                      "rel_l2"))
            for name, shape in plan():
                BENCH[name](*shape)
                if DEV.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    (out / "cp_overlap.json").write_text(json.dumps(RECORDS, indent=1) + "\n")
    print("wrote %d records to %s in %.0f s" % (len(RECORDS), out / "cp_overlap.json",
                                                time.time() - t0))
    # At world 1 every mode computes what the single-device call does: fp32 on the CPU to
    # rounding; bf16 on a GPU up to the key gradients' atomic summation order.
    tol = 1e-6 if SMOKE else 2e-2
    bad = [r for r in RECORDS if (r["max_rel_l2_vs_single"] or 0.0) > tol]
    for r in bad:
        print("MISMATCH (rel L2 > %g): %s" % (tol, row(r)))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
