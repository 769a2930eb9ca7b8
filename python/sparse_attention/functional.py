"""User-facing functions: block_sparse_attention and deepseek_sparse_attention.

Both return outputs with autograd (the LSE is returned without gradient), run on the current
CUDA stream, and work under torch.compile(fullgraph=True) and CUDA graph capture. CPU tensors
run the library's fp64 reference (any float dtype, any head dim), which makes tiny gradient
checks possible; CUDA tensors run the GPU implementation that serves the shape, or raise
NotImplementedError naming what is missing.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi, _ops

_LAYOUTS = {"bhsd": _abi.SA_LAYOUT_BHSD, "bshd": _abi.SA_LAYOUT_BSHD}
_INT_DTYPES = (torch.int64, torch.int16, torch.int8, torch.uint8)


def _layout_id(layout: str) -> int:
    key = layout.lower() if isinstance(layout, str) else layout
    if key not in _LAYOUTS:
        raise ValueError(
            "SA_ERROR_INVALID_ARGUMENT: layout: expected 'bhsd' or 'bshd', got %r" % (layout,)
        )
    return _LAYOUTS[key]


def _int32(t: Optional[Tensor]) -> Optional[Tensor]:
    # Index tensors from torch (argsort, topk, nonzero) are int64; the library reads int32.
    if t is not None and t.dtype in _INT_DTYPES:
        return t.to(torch.int32)
    return t


def _inner_contiguous(t: Tensor) -> Tensor:
    # The library needs stride 1 on the last dimension; other strides are free.
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


def _broadcast_meta(t: Optional[Tensor], batch, heads) -> Optional[Tensor]:
    # [1, 1, ...] metadata (e.g. a FlexAttention BlockMask made with B=None, H=None) serves every
    # batch and head: expand it (stride 0, no copy).
    if t is None or t.dim() < 2:
        return t
    if (t.shape[0] == 1 and batch != 1) or (t.shape[1] == 1 and heads != 1):
        return t.expand(batch, heads, *t.shape[2:])
    return t


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q2k_index: Tensor,
    q2k_count: Optional[Tensor] = None,
    *,
    block_size: int = 128,
    layout: str = "bhsd",
    kv_block_len: Optional[Tensor] = None,
    count: Optional[int] = None,
    scale: Optional[float] = None,
    bucket_size: int = 0,
    deterministic: bool = False,
    validate: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention (SPEC section 1). Returns ``(o, lse)``.

    Args:
        q: ``[B, H_q, S_q, D]`` (layout ``"bhsd"``) or ``[B, S_q, H_q, D]`` (``"bshd"``).
        k: ``[B, H_kv, S_kv, D]``, v: ``[B, H_kv, S_kv, D_v]`` in the same layout;
            ``H_q % H_kv == 0`` (MHA, GQA, MQA). bf16/fp16 on CUDA; CPU also fp32/fp64.
        q2k_index: ``[B, H_q, N_q, K_max]`` integer: the KV blocks each query block attends
            (``N_q = ceil(S_q / block_size)``). B and H_q may be 1 to broadcast.
        q2k_count: ``[B, H_q, N_q]`` integer in ``[0, K_max]``: how many entries of each row are
            read. Absent: ``count`` entries (default ``K_max``) for every row.
        block_size: 64 or 128 (query and KV blocks).
        kv_block_len: ``[N_kv]`` or ``[B, N_kv]`` valid tokens per KV block (default: full
            blocks, the last one cut at ``S_kv``).
        scale: softmax scale (default ``1/sqrt(D)``).
        bucket_size: backward tuning: query blocks per group of a reverse row (0: automatic).
        deterministic: bitwise-reproducible gradients.
        validate: check the metadata values on the GPU first (synchronises; a debugging aid).
            The CPU reference always checks them.

    Returns:
        ``o`` (layout and dtype of ``q``, last dim ``D_v``) with autograd for q, k and v, and
        ``lse`` ``[B, H_q, S_q]`` fp32 (natural log; ``-inf`` for a row with no blocks), which
        carries no gradient.
    """
    layout_id = _layout_id(layout)
    if count is not None and q2k_count is not None:
        raise ValueError(
            "SA_ERROR_INVALID_ARGUMENT: count: give either count (one count for every row) or "
            "q2k_count (one per row), not both"
        )
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    q2k_index, q2k_count, kv_block_len = _int32(q2k_index), _int32(q2k_count), _int32(kv_block_len)
    if q.dim() == 4:
        batch = q.shape[0]
        heads = q.shape[1] if layout_id == _abi.SA_LAYOUT_BHSD else q.shape[2]
        q2k_index = _broadcast_meta(q2k_index, batch, heads)
        q2k_count = _broadcast_meta(q2k_count, batch, heads)
    return _ops.bsa_fwd(
        q, k, v, q2k_index, q2k_count, kv_block_len,
        int(block_size), layout_id, -1 if count is None else int(count),
        0.0 if scale is None else float(scale),
        int(bucket_size), bool(deterministic), bool(validate),
    )


def deepseek_sparse_attention(
    q: Tensor,
    kv: Tensor,
    topk_idx: Tensor,
    *,
    topk_length: Optional[Tensor] = None,
    sink: Optional[Tensor] = None,
    d_v: Optional[int] = None,
    scale: Optional[float] = None,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor]:
    """DeepSeek sparse attention, top-k sparse MLA (SPEC section 2). Returns ``(out, lse)``.

    Args:
        q: ``[S_q, H, D_qk]`` (flat, token-major: batches concatenated).
        kv: ``[S_kv, D_qk]``: one latent record per key shared by all heads; the value is
            ``kv[:, :d_v]``. Dtype of q (bf16 on CUDA; CPU also fp16/fp32/fp64).
        topk_idx: ``[S_q, topk]`` integer global rows of ``kv``. Any value is allowed: slots
            outside ``[0, S_kv)`` (e.g. -1) are inactive.
        topk_length: ``[S_q]`` integer: only the first ``topk_length[t]`` slots of row t are
            active (optional).
        sink: ``[H]`` per-head logit that joins the softmax denominator but has no value
            (optional; converted to fp32). Its gradient is computed.
        d_v: value width (default 512; at most D_qk).
        scale: softmax scale (default ``1/sqrt(D_qk)``).
        deterministic: bitwise-reproducible ``dkv`` and ``d_sink``.

    Returns:
        ``out`` ``[S_q, H, d_v]`` (dtype of q) with autograd for q, kv and sink, and ``lse``
        ``[S_q, H]`` fp32 (sink excluded; ``+inf`` for an empty row), without gradient.
    """
    q, kv = _inner_contiguous(q), _inner_contiguous(kv)
    topk_idx, topk_length = _int32(topk_idx), _int32(topk_length)
    if sink is not None and sink.dtype != torch.float32:
        sink = sink.to(torch.float32)
    return _ops.dsa_fwd(
        q, kv, topk_idx, topk_length, sink, 0 if d_v is None else int(d_v),
        0.0 if scale is None else float(scale),
        bool(deterministic),
    )
