"""User-facing functions of the DSA lightning indexer (SPEC section 5): indexer_scores,
indexer_topk and indexer_kl_loss.

    I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>)    for k_start[t] <= s < k_end[t]

indexer_topk's (topk_idx, topk_length) go straight into deepseek_sparse_attention; the attention's
lse then goes into indexer_kl_loss, which trains q_I, k_I and w to imitate the attention. CPU
tensors run the library's fp64 reference (any float dtype and size); CUDA tensors run the CUDA
kernels, the Hopper ones on sm_90 (bf16, D_I 128, H_I in {16, 32, 64}). Everything works under
torch.compile(fullgraph=True) and CUDA graphs.
"""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _indexer_ops
from .functional import (_INT32_MAX, _INT32_MIN, _INT_DTYPES, _distinct, _inner_contiguous, _int,
                         _invalid, _scale, _tensor, _topk_idx_int32, _topk_length_int32)


def _weights(w: Tensor) -> Tensor:
    # The library takes fp32 weights (the reference also fp64).
    return w if w.dtype in (torch.float32, torch.float64) else w.float()


def _range_int32(t: Optional[Tensor], name: str, k_I: Tensor) -> Optional[Tensor]:
    """k_start / k_end as int32 without wrapping: int64 values are clamped to int32. The range
    of query t is [k_start[t], k_end[t]) clamped to [0, S_kv) (SPEC 5), and S_kv fits int32, so
    the clamp keeps every range as it is. Other dtypes go on as they are: the library names
    the argument and its dtype."""
    if t is None or t.dtype not in _INT_DTYPES:
        return t
    if t.dtype == torch.int64:
        rows = k_I.shape[0] if k_I.dim() >= 1 else 0
        if isinstance(rows, int) and rows > _INT32_MAX:
            raise _invalid("k_I: S_kv = %d rows, more than int32 %s values can address; int64 "
                           "values past 2^31 - 1 cannot be narrowed" % (rows, name))
        return _distinct(t, lambda x: x.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32))
    return _distinct(t, lambda x: x.to(torch.int32))


def _inputs(q_I, k_I, w, k_start, k_end):
    """The indexer's common arguments, type-checked and in the library's form."""
    q_I, k_I, w = _tensor(q_I, "q_I"), _tensor(k_I, "k_I"), _tensor(w, "w")
    k_start = _tensor(k_start, "k_start", optional=True)
    k_end = _tensor(k_end, "k_end", optional=True)
    return (_inner_contiguous(q_I), _inner_contiguous(k_I), _inner_contiguous(_weights(w)),
            _range_int32(k_start, "k_start", k_I), _range_int32(k_end, "k_end", k_I))


def indexer_scores(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    scale: Optional[float] = None,
    k_start: Optional[Tensor] = None,
    k_end: Optional[Tensor] = None,
) -> Tensor:
    """The indexer's dense score matrix (short sequences and tests).

    Args:
        q_I: ``[S_q, H_I, D_I]`` indexer queries (bf16 on CUDA; CPU also fp16/fp32/fp64).
        k_I: ``[S_kv, D_I]`` indexer keys, one per token, shared by all indexer heads.
        w: ``[S_q, H_I]`` per-token head weights (fp32; converted if needed).
        scale: ``scale_I``; None (the default) means ``1/sqrt(D_I)``; other values as in
            ``block_sparse_attention`` (0 is refused).
        k_start, k_end: ``[S_q]`` integer: query t may choose keys ``k_start[t] <= s <
            k_end[t]`` (clamped to ``[0, S_kv)``; default every key). Any value is allowed
            (int64 values are clamped to int32, which keeps the range).

    Returns:
        ``[S_q, S_kv]`` fp32: ``I[t, s]`` in range, ``-inf`` outside. No gradient.
    """
    q_I, k_I, w, k_start, k_end = _inputs(q_I, k_I, w, k_start, k_end)
    return _indexer_ops.indexer_scores(q_I, k_I, w, k_start, k_end, _scale(scale, "1/sqrt(D_I)"))


def indexer_topk(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    topk: int,
    k_start: Optional[Tensor] = None,
    k_end: Optional[Tensor] = None,
    *,
    scale: Optional[float] = None,
) -> Tuple[Tensor, Tensor]:
    """Each query's top-k keys, in the form ``deepseek_sparse_attention`` takes.

    Row t holds the ``topk`` keys of its range with the largest scores (ties to the smaller key
    index; the scores ranked as the fp32 values ``indexer_scores`` returns), in increasing key
    order, then -1. Bitwise identical on every run. Arguments as for ``indexer_scores``.

    Returns:
        ``topk_idx`` ``[S_q, topk]`` int32 and ``topk_length`` ``[S_q]`` int32
        (``min(topk, keys in range)``); no gradient.
    """
    q_I, k_I, w, k_start, k_end = _inputs(q_I, k_I, w, k_start, k_end)
    topk = _int(topk, "topk")
    if topk < 1:
        raise _invalid("topk: expected >= 1, got %d" % topk)
    scale = _scale(scale, "1/sqrt(D_I)")
    return _indexer_ops.indexer_topk(q_I, k_I, w, k_start, k_end, topk, scale)


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
    deterministic: bool = False,
    return_per_token: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The indexer's KL training loss (SPEC 5), differentiable in ``q_I``, ``k_I`` and ``w``.

    For query t and key set ``K_t``: the attention target ``p = A / sum_{K_t} A`` with
    ``A[t, s] = sum_h exp(scale * <q[t, h], kv[s]> - lse[t, h])``, the indexer distribution
    ``r = softmax_{K_t}(I[t, :])``, and ``loss = coeff * sum_t sum_{s in K_t} p (log p - log r)``.

    Args:
        q_I, k_I, w, k_start, k_end: the indexer's inputs, as for ``indexer_scores``.
        q: ``[S_q, H, D_qk]``, kv: ``[S_kv, D_qk]``: the attention's inputs (no gradient flows
            into them).
        lse: ``[S_q, H]`` fp32: the attention forward's LSE (``deepseek_sparse_attention``'s
            second output; in dense mode the dense attention's LSE over each range).
        topk_idx, topk_length: sparse mode: ``K_t`` is the active slots of row t (the keys the
            sparse attention used) within its range, as in ``deepseek_sparse_attention``: an
            index outside ``[0, S_kv)`` (e.g. -1, or an int64 value outside int32) is an
            inactive slot, and int64 lengths are clamped to int32, which keeps their meaning.
            Absent: dense mode, ``K_t`` is the range (the warm-up stage).
        coeff: loss coefficient (finite). scale: the attention's softmax scale; None (the
            default) means ``1/sqrt(D_qk)``. scale_I: the indexer's; None (the default) means
            ``1/sqrt(D_I)``. Other scales as in ``block_sparse_attention`` (0 is refused).
        deterministic: bitwise-reproducible ``dk_I`` on GPU paths.
        return_per_token: also return the ``[S_q]`` per-token terms (they sum to the loss and
            carry no gradient).

    Returns:
        The 0-dim loss (fp32; fp64 for fp64 ``q_I``), or ``(loss, per_token)``. Rows with an
        empty ``K_t`` contribute no loss and no gradient.
    """
    q_I, k_I, w, k_start, k_end = _inputs(q_I, k_I, w, k_start, k_end)
    q, kv, lse = _tensor(q, "q"), _tensor(kv, "kv"), _tensor(lse, "lse")
    topk_idx = _tensor(topk_idx, "topk_idx", optional=True)
    topk_length = _tensor(topk_length, "topk_length", optional=True)
    if isinstance(coeff, bool) or not isinstance(coeff, numbers.Real):
        raise TypeError("coeff: expected a float, got %s" % type(coeff).__name__)
    scale = _scale(scale, "1/sqrt(D_qk)")
    scale_I = _scale(scale_I, "1/sqrt(D_I)", "scale_I")
    if topk_idx is not None:
        topk_idx = _topk_idx_int32(topk_idx, kv)
    topk_length = _topk_length_int32(topk_length)
    compute_grad = torch.is_grad_enabled() and (q_I.requires_grad or k_I.requires_grad
                                                or w.requires_grad)
    loss, per_token, _, _, _ = _indexer_ops.indexer_loss(
        q_I, k_I, w, _inner_contiguous(q.detach()), _inner_contiguous(kv.detach()), lse.detach(),
        topk_idx, topk_length, k_start, k_end,
        float(coeff), scale, scale_I, bool(deterministic), bool(compute_grad),
    )
    return (loss, per_token) if return_per_token else loss
