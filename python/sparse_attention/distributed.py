"""Context parallelism (SPEC section 6): the operations sharded over the ranks of a
``torch.distributed`` process group (NCCL on GPUs, gloo on CPUs), the query tokens split across
the ranks in rank order.

Each rank passes its own contiguous shard of the token dimension: its query rows, and its rows of
the keys (``kv``, ``k_I``, BSA's ``k`` and ``v``), any sizes, in rank order. The wrappers
all-gather the key rows, run the single-device operation on the rank's queries against every key,
and in the backward reduce-scatter the key gradients back to the ranks that own those rows
(gloo, which has no reduce-scatter: an all-reduce, then each rank keeps its rows). Indices stay
global: ``topk_idx`` and BSA's block ids address the concatenated keys.

What equals the single-device call (to SPEC section 3's tolerance): each rank's outputs (its
query rows), its query gradients, and its rows of the key gradients. Per-token losses and
replicated parameters stay per rank, as for any sharded model: the indexer loss each rank returns
covers its own tokens (the single-device loss is their sum), and a sink's gradient covers the
rank's queries (sum it over the group with the other replicated parameters' gradients).

Every rank holds at least one query token (checked on every rank alike, before the keys move),
and the ranks agree on which key tensors require a gradient (a rank that skips the backward
leaves the others waiting in its collective). Key gradients of 16-bit tensors are summed across
ranks in fp32.

Overlap: ``all_gather_rows_async`` starts a key gather and returns a ``PendingRows``, which the
wrappers take in place of their key tensors; started one layer ahead, the gather runs while the
current layer computes. Without it, and in the backward, the collectives are synchronous.

Shard sizes: each call exchanges every rank's row counts (a few bytes, but a host
synchronisation, which leaves the GPU idle while the host prepares the rest of the call: 9.5% of
a BSA forward and backward at S 8192 on one H100, bench/cp_overlap.py). A caller whose split is
static passes ``shard_sizes`` (tokens per rank, the same for the queries and every key tensor,
and the same list on every rank): no exchange. A rank whose tensors disagree with its entry
raises before any collective; ranks that pass different lists are not detected.
"""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import functional as _functional
from . import indexer as _indexer

__all__ = [
    "PendingRows",
    "all_gather_rows",
    "all_gather_rows_async",
    "block_sparse_attention",
    "deepseek_sparse_attention",
    "indexer_kl_loss",
    "indexer_topk",
]


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _exchange(values: Sequence[int], device, group) -> List[List[int]]:
    """``values`` of every rank of ``group`` in one small all-gather: entry i is value i on
    every rank, in rank order."""
    n = torch.tensor(list(values), dtype=torch.int64, device=device)
    parts = [torch.zeros_like(n) for _ in range(_group_size(group))]
    dist.all_gather(parts, n, group=group)
    return [list(col) for col in zip(*torch.stack(parts).tolist())]


def _pad_rows(x: Tensor, dim: int, width: int) -> Tensor:
    """``x`` with zero rows appended along ``dim`` up to ``width``."""
    if x.shape[dim] >= width:
        return x.contiguous()
    pad = list(x.shape)
    pad[dim] = width - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad)], dim=dim)


def _scatter_sum(g: Tensor, dim: int, sizes: List[int], group) -> Tensor:
    """This rank's rows of the sum over ranks of ``g`` (the rows of every rank along ``dim``),
    summed in fp32 for 16-bit gradients."""
    rank = dist.get_rank(group)
    start = sum(sizes[:rank])
    dtype = g.dtype
    if dtype in (torch.float16, torch.bfloat16):
        g = g.float()
    if g.is_cuda and "nccl" in str(dist.get_backend(group)).lower():
        chunks = [_pad_rows(g.narrow(dim, sum(sizes[:r]), n), dim, max(sizes))
                  for r, n in enumerate(sizes)]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=group)
        return out.narrow(dim, 0, sizes[rank]).to(dtype)
    total = g.contiguous().clone()
    dist.all_reduce(total, group=group)
    return total.narrow(dim, start, sizes[rank]).to(dtype).contiguous()


class _Gathered(torch.autograd.Function):
    """``full`` (every rank's rows of ``x``, gathered) as a function of ``x``: the gradient of
    this rank's rows is the sum over ranks of the gradient of ``full``'s (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, full, dim, group, sizes):
        ctx.dim, ctx.group, ctx.sizes = dim, group, sizes
        return full.view_as(full)

    @staticmethod
    def backward(ctx, g):
        return _scatter_sum(g, ctx.dim, ctx.sizes, ctx.group), None, None, None, None


class PendingRows:
    """An all-gather of key rows in flight (``all_gather_rows_async``). Pass it where a wrapper
    takes its keys (``kv``, ``k``, ``v``, ``k_I``): the wrapper waits for it instead of gathering.
    ``wait()`` returns the gathered tensor, with autograd as ``all_gather_rows``."""

    def __init__(self, x: Tensor, dim: int, group, sizes: List[int], parts, work):
        self.x, self.dim, self.group, self.sizes = x, dim, group, sizes
        self._parts, self._work, self._full, self._padded = parts, work, None, None

    def wait(self) -> Tensor:
        if self._full is None:
            if self._parts is None:  # one rank: nothing was sent
                self._full = self.x
            else:
                if self._work is not None:  # an asynchronous gather
                    self._work.wait()
                full = torch.cat([p.narrow(self.dim, 0, n)
                                  for p, n in zip(self._parts, self.sizes)], dim=self.dim)
                self._full = _Gathered.apply(self.x, full, self.dim, self.group, self.sizes)
            self._parts = self._work = self._padded = None
        return self._full


# Benchmarks only (bench/cp_overlap.py): True issues the key all-gather, its concatenation and the
# backward's reduce-scatter even on a group of one rank, which otherwise skips them (nothing to
# move), so that one GPU can time what the collectives and copies cost.
_ISSUE_AT_WORLD_1 = False


def _start_gather(x: Tensor, dim: int, group, sizes: Optional[List[int]],
                  async_op: bool) -> PendingRows:
    if sizes is None:
        sizes = _exchange([x.shape[dim]], x.device, group)[0]
    if _group_size(group) == 1 and not _ISSUE_AT_WORLD_1:
        return PendingRows(x, dim, group, sizes, None, None)
    padded = _pad_rows(x.detach(), dim, max(sizes))
    parts = [torch.empty_like(padded) for _ in sizes]
    work = dist.all_gather(parts, padded, group=group, async_op=async_op)
    # The padded input stays referenced until the gather is waited for.
    pending = PendingRows(x, dim, group, sizes, parts, work)
    pending._padded = padded
    return pending


def all_gather_rows_async(x: Tensor, dim: int = 0, group=None,
                          sizes: Optional[List[int]] = None) -> PendingRows:
    """Starts ``all_gather_rows(x, dim, group)`` and returns at once. On NCCL the rows move on
    the communication stream while this stream runs other kernels, e.g. the next layer's keys
    during this layer's attention. ``sizes``: every rank's row count, when the caller has them
    (else they are exchanged first, synchronously)."""
    return _start_gather(x, dim, group, sizes, True)


def all_gather_rows(x: Tensor, dim: int = 0, group=None,
                    sizes: Optional[List[int]] = None) -> Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (sizes may differ), with
    autograd: the gradient each rank gets back is the sum over ranks of the gradient of its
    rows (a reduce-scatter)."""
    return _start_gather(x, dim, group, sizes, False).wait()


def _shards(name: str, n_q: int, keys: Sequence[Tuple[object, int]], device,
            group, known: Optional[Sequence[int]] = None
            ) -> Tuple[List[int], List[Optional[List[int]]]]:
    """One exchange of every rank's query count and key row counts (``keys``: (tensor or
    PendingRows, dim); a PendingRows has its counts already: None). Raises on every rank alike,
    before any key moves, when a rank has no query token (the one-device operations take
    S_q >= 1). ``known``: the caller's tokens per rank, the same split for the queries and every
    key tensor (``shard_sizes``): no exchange (no collective, no host synchronisation); this
    rank's tensors are checked against its entry."""
    values = [n_q] + [0 if isinstance(x, PendingRows) else x.shape[d] for x, d in keys]
    if known is not None:
        table = _known_table(name, known, values, keys, group)
    else:
        table = _exchange(values, device, group)
    queries = table[0]
    empty = [r for r, n in enumerate(queries) if n < 1]
    if empty:
        raise ValueError("%s: rank %d holds no query tokens (every rank needs at least one; "
                         "shards per rank: %s)" % (name, empty[0], queries))
    return queries, [None if isinstance(x, PendingRows) else table[1 + i]
                     for i, (x, _) in enumerate(keys)]


def _known_table(name: str, known: Sequence[int], values: List[int],
                 keys: Sequence[Tuple[object, int]], group) -> List[List[int]]:
    """``_exchange``'s table from the caller's ``shard_sizes``, after checking this rank's rows
    against them (a rank that disagrees raises before any collective)."""
    sizes = [int(n) for n in known]
    world, rank = _group_size(group), dist.get_rank(group)
    if len(sizes) != world:
        raise ValueError("shard_sizes: %d entries for a group of %d ranks" % (len(sizes), world))
    names = [name] + ["key tensor %d" % i for i in range(len(keys))]
    for i, (n, label) in enumerate(zip(values, names)):
        if i > 0 and isinstance(keys[i - 1][0], PendingRows):
            continue
        if n != sizes[rank]:
            raise ValueError("shard_sizes: rank %d's %s has %d rows, shard_sizes says %d"
                             % (rank, label, n, sizes[rank]))
    return [list(sizes) for _ in values]


def _keys(x, dim: int, group, sizes) -> Tensor:
    """Every rank's rows of the keys ``x``: a PendingRows is waited for, a tensor gathered."""
    if isinstance(x, PendingRows):
        if x.dim != dim:
            raise ValueError("a PendingRows gathered along dim %d where dim %d is needed"
                             % (x.dim, dim))
        return x.wait()
    return all_gather_rows(x, dim, group, sizes)


def _device_of(x) -> torch.device:
    return x.x.device if isinstance(x, PendingRows) else x.device


def _rows(t: Tensor, dim: int = 0) -> int:
    return t.shape[dim] if t.dim() > dim else 0


# ---- DSA -----------------------------------------------------------------------------------------
def deepseek_sparse_attention(
    q: Tensor,
    kv: Tensor,
    topk_idx: Tensor,
    *,
    group=None,
    topk_length: Optional[Tensor] = None,
    sink: Optional[Tensor] = None,
    d_v: Optional[int] = None,
    scale: Optional[float] = None,
    deterministic: bool = False,
    shard_sizes: Optional[Sequence[int]] = None,
) -> Tuple[Tensor, Tensor]:
    """``sparse_attention.deepseek_sparse_attention`` over ``group``: ``q`` ``[S_q_rank, H,
    D_qk]`` is this rank's query rows, ``kv`` ``[S_kv_rank, D_qk]`` its rows of the keys (rank
    order), ``topk_idx`` / ``topk_length`` this rank's rows, with global key indices. Returns
    this rank's ``(out, lse)``; ``kv``'s gradient is this rank's rows of the global one."""
    _, (kv_sizes,) = _shards("q", _rows(q), [(kv, 0)], _device_of(kv), group, shard_sizes)
    kv_all = _keys(kv, 0, group, kv_sizes)
    return _functional.deepseek_sparse_attention(
        q, kv_all, topk_idx, topk_length=topk_length, sink=sink, d_v=d_v, scale=scale,
        deterministic=deterministic)


# ---- the indexer ---------------------------------------------------------------------------------
def indexer_topk(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    topk: int,
    k_start: Optional[Tensor] = None,
    k_end: Optional[Tensor] = None,
    *,
    group=None,
    scale: Optional[float] = None,
    shard_sizes: Optional[Sequence[int]] = None,
) -> Tuple[Tensor, Tensor]:
    """``sparse_attention.indexer_topk`` over ``group``: this rank's ``q_I`` ``[S_q_rank, H_I,
    D_I]``, ``w`` and ranges (global key positions), its rows of ``k_I`` (rank order). Returns
    this rank's ``(topk_idx, topk_length)`` with global key indices."""
    _, (k_sizes,) = _shards("q_I", _rows(q_I), [(k_I, 0)], _device_of(k_I), group, shard_sizes)
    k_all = _keys(k_I, 0, group, k_sizes).detach()
    return _indexer.indexer_topk(q_I, k_all, w, topk, k_start, k_end, scale=scale)


def indexer_kl_loss(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    q: Tensor,
    kv: Tensor,
    lse: Tensor,
    topk_idx: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
    k_start: Optional[Tensor] = None,
    k_end: Optional[Tensor] = None,
    coeff: float = 1.0,
    scale: Optional[float] = None,
    scale_I: Optional[float] = None,
    *,
    group=None,
    deterministic: bool = False,
    return_per_token: bool = False,
    shard_sizes: Optional[Sequence[int]] = None,
):
    """``sparse_attention.indexer_kl_loss`` over ``group``: this rank's query-side tensors
    (``q_I``, ``w``, ``q``, ``lse``, ``topk_idx``, ``topk_length``, the ranges with global key
    positions) and its rows of ``k_I`` and ``kv`` (rank order). Returns the loss of this rank's
    tokens (the single-device loss is the sum over ranks); ``k_I``'s gradient is this rank's
    rows of the gradient of that sum."""
    _, (k_sizes, kv_sizes) = _shards("q_I", _rows(q_I), [(k_I, 0), (kv, 0)], _device_of(k_I),
                                     group, shard_sizes)
    k_all = _keys(k_I, 0, group, k_sizes)
    kv_all = _keys(kv, 0, group, kv_sizes).detach()
    return _indexer.indexer_kl_loss(
        q_I, k_all, w, q, kv_all, lse, topk_idx, topk_length, k_start, k_end, coeff, scale,
        scale_I, deterministic=deterministic, return_per_token=return_per_token)


# ---- BSA -----------------------------------------------------------------------------------------
def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q2k_index: Tensor,
    q2k_count: Optional[Tensor] = None,
    *,
    group=None,
    block_size: int = 128,
    layout: str = "bhsd",
    kv_block_len: Optional[Tensor] = None,
    count: Optional[int] = None,
    scale: Optional[float] = None,
    deterministic: bool = False,
    validate: bool = False,
    mask: Optional[str] = None,
    causal_offset: Optional[int] = None,
    window_left: Optional[int] = None,
    window_right: Optional[int] = None,
    shard_sizes: Optional[Sequence[int]] = None,
) -> Tuple[Tensor, Tensor]:
    """``sparse_attention.block_sparse_attention`` over ``group``, the sequence split across the
    ranks: this rank's query tokens and its tokens of ``k`` and ``v`` (rank order; ``layout``
    as on one device), ``q2k_index`` / ``q2k_count`` the rows of this rank's query blocks with
    global KV block ids. Every rank but the last holds a whole number of query blocks. A token
    mask keeps its global meaning: ``causal_offset`` (default ``S_kv - S_q`` of the whole
    sequence) is taken relative to the global token positions. Returns this rank's ``(o, lse)``;
    ``k`` and ``v`` get this rank's rows of the global gradients."""
    seq_dim = 2 if str(layout).lower() == "bhsd" else 1
    counts, (k_sizes, v_sizes) = _shards("q", _rows(q, seq_dim), [(k, seq_dim), (v, seq_dim)],
                                         q.device, group, shard_sizes)
    # Checked on every rank alike, so that all of them raise before the next collective.
    for r in range(1, len(counts)):
        first = sum(counts[:r])
        if first % int(block_size) != 0:
            raise ValueError(
                "q: rank %d's first token %d is not at a query block boundary (block_size %d): "
                "every rank but the last must hold a whole number of query blocks"
                % (r, first, int(block_size)))
    q_first, s_q = sum(counts[:dist.get_rank(group)]), sum(counts)
    k_all = _keys(k, seq_dim, group, k_sizes)
    v_all = _keys(v, seq_dim, group, v_sizes)
    if mask is not None and str(mask).lower() != "none":
        offset = k_all.shape[seq_dim] - s_q if causal_offset is None else int(causal_offset)
        causal_offset = offset + q_first
    return _functional.block_sparse_attention(
        q, k_all, v_all, q2k_index, q2k_count, block_size=block_size, layout=layout,
        kv_block_len=kv_block_len, count=count, scale=scale, deterministic=deterministic,
        validate=validate, mask=mask, causal_offset=causal_offset, window_left=window_left,
        window_right=window_right)
