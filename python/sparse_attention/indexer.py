"""User-facing functions of the DSA lightning indexer (SPEC section 5): indexer_scores,
indexer_topk and indexer_kl_loss.

    I[t, s] = sum_j w[t, j] * relu(scale_I * <q_I[t, j], k_I[s]>)    for k_start[t] <= s < k_end[t]

indexer_topk's (topk_idx, topk_length) go straight into deepseek_sparse_attention; the attention's
lse then goes into indexer_kl_loss, which trains q_I, k_I and w to imitate the attention. CPU
tensors run the library's fp64 reference (any float dtype and size); CUDA tensors raise
NotImplementedError until the GPU kernels land. Everything works under
torch.compile(fullgraph=True).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _indexer_ops
from .functional import _inner_contiguous, _int32


def _weights(w: Tensor) -> Tensor:
    # The library takes fp32 weights (the reference also fp64).
    return w if w.dtype in (torch.float32, torch.float64) else w.float()


def _scale(v: Optional[float]) -> float:
    return 0.0 if v is None else float(v)


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
        scale: ``scale_I`` (default ``1/sqrt(D_I)``).
        k_start, k_end: ``[S_q]`` integer: query t may choose keys ``k_start[t] <= s <
            k_end[t]`` (clamped to ``[0, S_kv)``; default every key).

    Returns:
        ``[S_q, S_kv]`` fp32: ``I[t, s]`` in range, ``-inf`` outside. No gradient.
    """
    return _indexer_ops.indexer_scores(
        _inner_contiguous(q_I), _inner_contiguous(k_I), _inner_contiguous(_weights(w)),
        _int32(k_start), _int32(k_end), _scale(scale),
    )


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
    if int(topk) < 1:
        raise ValueError("SA_ERROR_INVALID_ARGUMENT: topk: expected >= 1, got %d" % int(topk))
    return _indexer_ops.indexer_topk(
        _inner_contiguous(q_I), _inner_contiguous(k_I), _inner_contiguous(_weights(w)),
        _int32(k_start), _int32(k_end), int(topk), _scale(scale),
    )


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
            sparse attention used) within its range. Absent: dense mode, ``K_t`` is the range
            (the warm-up stage).
        coeff: loss coefficient. scale: the attention's softmax scale (default
            ``1/sqrt(D_qk)``). scale_I: the indexer's (default ``1/sqrt(D_I)``).
        deterministic: bitwise-reproducible ``dk_I`` on GPU paths.
        return_per_token: also return the ``[S_q]`` per-token terms (they sum to the loss and
            carry no gradient).

    Returns:
        The 0-dim loss (fp32; fp64 for fp64 ``q_I``), or ``(loss, per_token)``. Rows with an
        empty ``K_t`` contribute no loss and no gradient.
    """
    q_I, k_I, w = _inner_contiguous(q_I), _inner_contiguous(k_I), _inner_contiguous(_weights(w))
    compute_grad = torch.is_grad_enabled() and (q_I.requires_grad or k_I.requires_grad
                                                or w.requires_grad)
    loss, per_token, _, _, _ = _indexer_ops.indexer_loss(
        q_I, k_I, w, _inner_contiguous(q.detach()), _inner_contiguous(kv.detach()), lse.detach(),
        _int32(topk_idx), _int32(topk_length), _int32(k_start), _int32(k_end),
        float(coeff), _scale(scale), _scale(scale_I), bool(deterministic), bool(compute_grad),
    )
    return (loss, per_token) if return_per_token else loss
