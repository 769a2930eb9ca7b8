"""Context parallelism (SPEC 6, sparse_attention.distributed) on the CPU: 2 and 4 gloo
processes, even and uneven token splits. Every rank's outputs, query gradients and rows of the key
gradients equal the single-device call on the whole inputs (fp64 reference path, so to rounding);
replicated gradients (the sink's) and the indexer loss equal it once summed over the ranks.
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sparse_attention import (block_sparse_attention, deepseek_sparse_attention,
                              indexer_kl_loss, indexer_topk)
from sparse_attention import distributed as cp

F64 = torch.float64
TOL = dict(rtol=1e-9, atol=1e-11)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _worker(rank, world, init, fn, args):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        fn(rank, world, *args)
        dist.barrier()  # no rank tears its connections down while a peer still reads from them
    finally:
        dist.destroy_process_group()


def run(world, fn, *args):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, "file://" + os.path.join(d, "store"), fn, args),
                 nprocs=world, join=True)


def bounds(sizes, rank):
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


# ---- DSA -----------------------------------------------------------------------------------------
def dsa_case(s=40, h=2, d_qk=16, d_v=8, topk=6):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(s, h, d_qk, generator=g, dtype=F64)
    kv = torch.randn(s, d_qk, generator=g, dtype=F64)
    idx = torch.randint(-1, s, (s, topk), generator=g)
    length = torch.randint(0, topk + 1, (s,), generator=g)
    sink = torch.randn(h, generator=g, dtype=torch.float32)
    dout = torch.randn(s, h, d_v, generator=g, dtype=F64)
    return q, kv, idx, length, sink, dout, d_v


def dsa_rank(rank, world, sizes, prefetch=False, known=False):
    q, kv, idx, length, sink, dout, d_v = dsa_case()
    leaves = [t.clone().requires_grad_() for t in (q, kv, sink)]
    want_o, want_lse = deepseek_sparse_attention(leaves[0], leaves[1], idx, topk_length=length,
                                                 sink=leaves[2], d_v=d_v)
    (want_o * dout).sum().backward()
    a, b = bounds(sizes, rank)
    ql, kvl = q[a:b].clone().requires_grad_(), kv[a:b].clone().requires_grad_()
    sl = sink.clone().requires_grad_()
    keys = cp.all_gather_rows_async(kvl) if prefetch else kvl
    o, lse = cp.deepseek_sparse_attention(ql, keys, idx[a:b], topk_length=length[a:b], sink=sl,
                                          d_v=d_v, shard_sizes=sizes if known else None)
    (o * dout[a:b]).sum().backward()
    torch.testing.assert_close(o, want_o[a:b].detach(), **TOL)
    torch.testing.assert_close(lse, want_lse[a:b], **TOL)
    torch.testing.assert_close(ql.grad, leaves[0].grad[a:b], **TOL)
    torch.testing.assert_close(kvl.grad, leaves[1].grad[a:b], **TOL)
    d_sink = sl.grad.clone()
    dist.all_reduce(d_sink)
    torch.testing.assert_close(d_sink, leaves[2].grad, rtol=1e-5, atol=1e-6)  # fp32 sink


# ---- the indexer ---------------------------------------------------------------------------------
def indexer_case(s=24, h_i=3, d_i=8, h=2, d_qk=16, topk=5):
    g = torch.Generator().manual_seed(2)
    q_I = torch.randn(s, h_i, d_i, generator=g, dtype=F64)
    k_I = torch.randn(s, d_i, generator=g, dtype=F64)
    w = torch.rand(s, h_i, generator=g, dtype=F64) * 2 - 0.5
    q = torch.randn(s, h, d_qk, generator=g, dtype=F64)
    kv = torch.randn(s, d_qk, generator=g, dtype=F64)
    k_start = torch.zeros(s, dtype=torch.int32)
    k_end = torch.arange(s, dtype=torch.int32) + 1  # causal
    return q_I, k_I, w, q, kv, k_start, k_end, topk


def indexer_rank(rank, world, sizes, prefetch=False, known=False):
    q_I, k_I, w, q, kv, k_start, k_end, topk = indexer_case()
    a, b = bounds(sizes, rank)
    want_idx, want_len = indexer_topk(q_I, k_I, w, topk, k_start, k_end)
    shard = dict(shard_sizes=sizes) if known else {}
    idx, length = cp.indexer_topk(q_I[a:b], k_I[a:b], w[a:b], topk, k_start[a:b], k_end[a:b],
                                  **shard)
    assert torch.equal(idx, want_idx[a:b]) and torch.equal(length, want_len[a:b])

    _, lse = deepseek_sparse_attention(q, kv, want_idx, topk_length=want_len, d_v=8)
    leaves = [t.clone().requires_grad_() for t in (q_I, k_I, w)]
    want = indexer_kl_loss(*leaves, q, kv, lse, want_idx, want_len, k_start, k_end)
    want.backward()
    local = [t[a:b].clone().requires_grad_() for t in (q_I, k_I, w)]
    k_arg = cp.all_gather_rows_async(local[1]) if prefetch else local[1]
    kv_arg = cp.all_gather_rows_async(kv[a:b]) if prefetch else kv[a:b]
    loss = cp.indexer_kl_loss(local[0], k_arg, local[2], q[a:b], kv_arg, lse[a:b], idx, length,
                              k_start[a:b], k_end[a:b], **shard)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.testing.assert_close(total, want.detach(), **TOL)
    for got, full in zip(local, leaves):
        torch.testing.assert_close(got.grad, full.grad[a:b], **TOL)


# ---- BSA -----------------------------------------------------------------------------------------
def bsa_case(s=250, h=2, d=8, block=64):
    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, h, s, d, generator=g, dtype=F64) for _ in range(4))
    n = -(-s // block)
    index = torch.stack([torch.randperm(n, generator=g)[:3] for _ in range(h * n)])
    index = index.view(1, h, n, 3).to(torch.int32)
    count = torch.randint(1, 4, (1, h, n), generator=g, dtype=torch.int32)
    return q, k, v, dout, index, count, block


def bsa_rank(rank, world, sizes, mask, prefetch=False, known=False):
    q, k, v, dout, index, count, block = bsa_case()
    kw = dict(block_size=block, mask=mask)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_o, want_lse = block_sparse_attention(*leaves, index, count, **kw)
    (want_o * dout).sum().backward()
    a, b = bounds(sizes, rank)
    qa, qb = a // block, -(-b // block)
    local = [t[:, :, a:b].clone().requires_grad_() for t in (q, k, v)]
    k_arg, v_arg = local[1], local[2]
    if prefetch:  # both gathers in flight at once
        k_arg, v_arg = (cp.all_gather_rows_async(t, 2) for t in (local[1], local[2]))
    o, lse = cp.block_sparse_attention(local[0], k_arg, v_arg, index[:, :, qa:qb],
                                       count[:, :, qa:qb], **kw,
                                       **(dict(shard_sizes=sizes) if known else {}))
    (o * dout[:, :, a:b]).sum().backward()
    torch.testing.assert_close(o, want_o[:, :, a:b].detach(), **TOL)
    torch.testing.assert_close(lse, want_lse[:, :, a:b], **TOL)
    for got, full in zip(local, leaves):
        torch.testing.assert_close(got.grad, full.grad[:, :, a:b], **TOL)


# Token splits per world size (even and uneven; BSA's in whole query blocks but the last).
SPLITS = {
    2: dict(dsa=[[20, 20], [7, 33]], indexer=[[12, 12]], bsa=[[128, 122], [64, 186]]),
    4: dict(dsa=[[10, 10, 10, 10], [1, 17, 9, 13]], indexer=[[3, 9, 5, 7]],
            bsa=[[64, 64, 64, 58]]),
}


def every_case(rank, world):
    # One process group per world size: spawning costs seconds, the cases milliseconds.
    for sizes in SPLITS[world]["dsa"]:
        dsa_rank(rank, world, sizes)
    for sizes in SPLITS[world]["indexer"]:
        indexer_rank(rank, world, sizes)
    for sizes in SPLITS[world]["bsa"]:
        for mask in (None, "causal"):
            bsa_rank(rank, world, sizes, mask)
    # The same with the keys gathered ahead (all_gather_rows_async).
    dsa_rank(rank, world, SPLITS[world]["dsa"][-1], prefetch=True)
    indexer_rank(rank, world, SPLITS[world]["indexer"][-1], prefetch=True)
    bsa_rank(rank, world, SPLITS[world]["bsa"][-1], "causal", prefetch=True)
    # The same with the split given (shard_sizes: no exchange).
    dsa_rank(rank, world, SPLITS[world]["dsa"][-1], known=True)
    indexer_rank(rank, world, SPLITS[world]["indexer"][-1], known=True)
    bsa_rank(rank, world, SPLITS[world]["bsa"][-1], "causal", known=True)


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_device(world):
    run(world, every_case)


def _misaligned(rank, world):
    q, k, v, _, index, count, block = bsa_case()
    a, b = bounds([70, 180], rank)
    with pytest.raises(ValueError, match="query block boundary"):
        cp.block_sparse_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], index, count,
                                  block_size=block)


def test_bsa_refuses_a_split_inside_a_query_block():
    run(2, _misaligned)


def _empty_shard(rank, world):
    q, kv, idx, length, sink, dout, d_v = dsa_case()
    a, b = bounds([0, 40], rank)
    with pytest.raises(ValueError, match="rank 0 holds no query tokens"):
        cp.deepseek_sparse_attention(q[a:b], kv[a:b], idx[a:b], d_v=d_v)


def test_an_empty_query_shard_is_refused_on_every_rank():
    run(2, _empty_shard)


def _wrong_shard_sizes(rank, world):
    q, kv, idx, length, sink, dout, d_v = dsa_case()
    a, b = bounds([20, 20], rank)
    with pytest.raises(ValueError, match="shard_sizes: rank %d's q has 20 rows" % rank):
        cp.deepseek_sparse_attention(q[a:b], kv[a:b], idx[a:b], d_v=d_v, shard_sizes=[21, 19])
    with pytest.raises(ValueError, match="shard_sizes: 3 entries for a group of 2 ranks"):
        cp.deepseek_sparse_attention(q[a:b], kv[a:b], idx[a:b], d_v=d_v, shard_sizes=[20, 20, 0])


def test_wrong_shard_sizes_are_refused_before_any_collective():
    run(2, _wrong_shard_sizes)


# ---- one GPU: NCCL at world size 1 (the GPU suite) -----------------------------------------------
def nccl_rank(rank, world):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(64, 64, 576, generator=g).to("cuda", torch.bfloat16)
    kv = torch.randn(64, 576, generator=g).to("cuda", torch.bfloat16)
    idx = torch.randint(0, 64, (64, 16), generator=g).to("cuda")
    want = deepseek_sparse_attention(q, kv, idx)
    got = cp.deepseek_sparse_attention(q, kv, idx)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _nccl_worker(rank, world, init):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        nccl_rank(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                    reason="needs a CUDA device and NCCL")
def test_nccl_world_size_one_matches_one_device():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_nccl_worker, args=(1, "file://" + os.path.join(d, "store")), nprocs=1,
                 join=True)
