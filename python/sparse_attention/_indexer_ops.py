"""The DSA lightning indexer (SPEC section 5) as torch.library custom operators, with fake
kernels and autograd:

    sparse_attention::indexer_scores   dense [S_q, S_kv] fp32 scores (no gradient)
    sparse_attention::indexer_topk     (topk_idx, topk_length), int32 (no gradient)
    sparse_attention::indexer_loss     (loss, loss_per_token, dq_I, dk_I, dw)

indexer_loss computes the loss and, with compute_grad, its gradients in the same library call
(sa_indexer_loss): both need the attention target p recomputed from q, kv and lse, and dense mode
cannot keep p between a forward and a backward. Its autograd formula therefore only scales the
saved gradients by the loss's incoming gradient; loss_per_token and the gradient outputs carry no
gradient themselves, and q, kv, lse get none (SPEC 5).

Outputs are new contiguous tensors (mutates_args=()), so torch.compile sees functional, opaque
calls. (No `from __future__ import annotations` here: torch.library reads the annotations.)
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi

_NS = "sparse_attention"


def _options(scale_I=0.0, scale=0.0, coeff=1.0, deterministic=False):
    """The C options (size set by the ctypes struct); the operators' 0.0 scales are the
    defaults, and every float is checked to survive the conversion to fp32."""
    o = _abi.sa_indexer_options()
    o.scale_I = _abi.scale_option(scale_I, "1/sqrt(D_I)", "scale_I")
    o.scale = _abi.scale_option(scale, "1/sqrt(D_qk)", "scale")
    o.coeff = _abi.float_option(coeff, "coeff")
    o.deterministic = int(bool(deterministic))
    o.impl = _abi.SA_IMPL_AUTO
    return o


def _rank_error(*named):
    """For symbolic shapes, which the library cannot check: the first (name, tensor, rank) whose
    rank is wrong, as the library words it."""
    for name, t, rank in named:
        if t.dim() != rank:
            return _abi._invalid("%s: expected rank %d, got rank %d" % (name, rank, t.dim()))
    return None


# ---- scores -------------------------------------------------------------------------------------
def _scores_args(q_I, k_I, w, k_start, k_end, scores, opts, shape_only):
    a = _abi.sa_indexer_scores_args()
    a.q_I = _abi.view(q_I, shape_only, "q_I")
    a.k_I = _abi.view(k_I, shape_only, "k_I")
    a.w = _abi.view(w, shape_only, "w")
    a.k_start = _abi.view(k_start, shape_only, "k_start")
    a.k_end = _abi.view(k_end, shape_only, "k_end")
    a.scores = _abi.view(scores, shape_only, "scores")
    a.options = opts
    return a


def _scores_output(q_I, k_I, w, k_start, k_end, opts, fake=False):
    """Validates the call's shapes (nothing allocated yet), then allocates the scores."""
    shape = (q_I.shape[0], k_I.shape[0]) if q_I.dim() == 3 and k_I.dim() == 2 else None
    inputs = (q_I, k_I, w, k_start, k_end)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        _abi.validate_shapes_once("indexer_scores", opts, inputs, lambda: _scores_args(
            q_I, k_I, w, k_start, k_end, _abi.Planned.of(shape, torch.float32), opts, True))
    if shape is None:  # symbolic shapes of the wrong rank
        raise _rank_error(("q_I", q_I, 3), ("k_I", k_I, 2))
    return q_I.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op(_NS + "::indexer_scores", mutates_args=())
def indexer_scores(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    k_start: Optional[Tensor],
    k_end: Optional[Tensor],
    scale_I: float,
) -> Tensor:
    opts = _options(scale_I=scale_I)
    scores = _scores_output(q_I, k_I, w, k_start, k_end, opts)
    _abi.run("indexer_scores", _scores_args(q_I, k_I, w, k_start, k_end, scores, opts, False),
             q_I.device)
    return scores


@indexer_scores.register_fake
def _indexer_scores_fake(q_I, k_I, w, k_start, k_end, scale_I):
    opts = _options(scale_I=scale_I)
    return _scores_output(q_I, k_I, w, k_start, k_end, opts, fake=True)


# ---- top-k --------------------------------------------------------------------------------------
def _topk_args(q_I, k_I, w, k_start, k_end, topk_idx, topk_length, opts, shape_only):
    a = _abi.sa_indexer_topk_args()
    a.q_I = _abi.view(q_I, shape_only, "q_I")
    a.k_I = _abi.view(k_I, shape_only, "k_I")
    a.w = _abi.view(w, shape_only, "w")
    a.k_start = _abi.view(k_start, shape_only, "k_start")
    a.k_end = _abi.view(k_end, shape_only, "k_end")
    a.topk_idx = _abi.view(topk_idx, shape_only, "topk_idx")
    a.topk_length = _abi.view(topk_length, shape_only, "topk_length")
    a.options = opts
    return a


def _topk_outputs(q_I, k_I, w, k_start, k_end, topk, opts, fake=False):
    """Validates the call's shapes (nothing allocated yet), then allocates topk_idx and
    topk_length."""
    if topk < 1:
        raise _abi._invalid("topk: expected >= 1, got %d" % topk)
    s_q = q_I.shape[0] if q_I.dim() == 3 else None
    inputs = (q_I, k_I, w, k_start, k_end)
    if not fake or (_abi.can_describe(*inputs) and isinstance(topk, int)):
        idx = _abi.Planned.of(None if s_q is None else (s_q, topk), torch.int32)
        length = _abi.Planned.of(None if s_q is None else (s_q,), torch.int32)
        # topk_idx's planned shape joins the key: topk is not part of the options.
        _abi.validate_shapes_once("indexer_topk", opts, inputs + (idx,), lambda: _topk_args(
            q_I, k_I, w, k_start, k_end, idx, length, opts, True))
    if s_q is None:  # symbolic shapes of the wrong rank
        raise _rank_error(("q_I", q_I, 3))
    return (q_I.new_empty((s_q, topk), dtype=torch.int32),
            q_I.new_empty((s_q,), dtype=torch.int32))


@torch.library.custom_op(_NS + "::indexer_topk", mutates_args=())
def indexer_topk(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    k_start: Optional[Tensor],
    k_end: Optional[Tensor],
    topk: int,
    scale_I: float,
) -> Tuple[Tensor, Tensor]:
    opts = _options(scale_I=scale_I)
    idx, length = _topk_outputs(q_I, k_I, w, k_start, k_end, topk, opts)
    _abi.run("indexer_topk", _topk_args(q_I, k_I, w, k_start, k_end, idx, length, opts, False),
             q_I.device)
    return idx, length


@indexer_topk.register_fake
def _indexer_topk_fake(q_I, k_I, w, k_start, k_end, topk, scale_I):
    opts = _options(scale_I=scale_I)
    return _topk_outputs(q_I, k_I, w, k_start, k_end, topk, opts, fake=True)


# ---- KL loss and its gradients ------------------------------------------------------------------
def _loss_args(q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end, outs, opts,
               shape_only):
    loss, per_token, dq_I, dk_I, dw = outs
    a = _abi.sa_indexer_loss_args()
    for name, t in (("q_I", q_I), ("k_I", k_I), ("w", w), ("q", q), ("kv", kv), ("lse", lse),
                    ("topk_idx", topk_idx), ("topk_length", topk_length), ("k_start", k_start),
                    ("k_end", k_end), ("loss", loss), ("loss_per_token", per_token),
                    ("dq_I", dq_I), ("dk_I", dk_I), ("dw", dw)):
        setattr(a, name, _abi.view(t, shape_only, name))
    a.options = opts
    return a


def _loss_outputs(q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end, opts,
                  compute_grad, fake):
    """Validates the call's shapes (nothing allocated yet), then allocates (loss, per_token,
    dq_I, dk_I, dw). The loss is fp32 (fp64 for fp64 q_I: the reference's gradient checks);
    without compute_grad the gradients are empty and not computed."""
    loss_dtype = torch.float64 if q_I.dtype == torch.float64 else torch.float32
    s_q = q_I.shape[0] if q_I.dim() == 3 else None
    inputs = (q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        planned = (_abi.Planned((), loss_dtype),
                   _abi.Planned.of(None if s_q is None else (s_q,), loss_dtype))
        grads = (tuple(_abi.Planned(t.shape, t.dtype) for t in (q_I, k_I, w)) if compute_grad
                 else (None, None, None))
        # The planned gradients join the key: with and without them are different calls.
        _abi.validate_shapes_once("indexer_loss", opts, inputs + grads, lambda: _loss_args(
            *inputs, planned + grads, opts, True))
    if s_q is None:  # symbolic shapes of the wrong rank
        raise _rank_error(("q_I", q_I, 3))
    loss = q_I.new_empty((), dtype=loss_dtype)
    per_token = q_I.new_empty((s_q,), dtype=loss_dtype)
    if compute_grad:
        grads = (q_I.new_empty(q_I.shape), k_I.new_empty(k_I.shape), w.new_empty(w.shape))
    else:
        grads = (q_I.new_empty((0,)), k_I.new_empty((0,)), w.new_empty((0,)))
    return (loss, per_token) + grads


@torch.library.custom_op(_NS + "::indexer_loss", mutates_args=())
def indexer_loss(
    q_I: Tensor,
    k_I: Tensor,
    w: Tensor,
    q: Tensor,
    kv: Tensor,
    lse: Tensor,
    topk_idx: Optional[Tensor],
    topk_length: Optional[Tensor],
    k_start: Optional[Tensor],
    k_end: Optional[Tensor],
    coeff: float,
    scale: float,
    scale_I: float,
    deterministic: bool,
    compute_grad: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = _options(scale_I, scale, coeff, deterministic)
    inputs = (q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end)
    outs = _loss_outputs(*inputs, opts, compute_grad, fake=False)
    views = outs if compute_grad else outs[:2] + (None, None, None)
    _abi.run("indexer_loss", _loss_args(*inputs, views, opts, False), q_I.device)
    return outs


@indexer_loss.register_fake
def _indexer_loss_fake(q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end, coeff,
                       scale, scale_I, deterministic, compute_grad):
    opts = _options(scale_I, scale, coeff, deterministic)
    return _loss_outputs(q_I, k_I, w, q, kv, lse, topk_idx, topk_length, k_start, k_end, opts,
                         compute_grad, fake=True)


def _loss_setup_context(ctx, inputs, output):
    loss, per_token, dq_I, dk_I, dw = output
    ctx.compute_grad = inputs[-1]
    ctx.save_for_backward(dq_I, dk_I, dw)
    ctx.mark_non_differentiable(per_token, dq_I, dk_I, dw)


def _loss_backward(ctx, g_loss, g_per_token, g_dq_I, g_dk_I, g_dw):
    none = (None,) * 12
    if g_loss is None or not ctx.compute_grad:
        return (None, None, None) + none
    dq_I, dk_I, dw = ctx.saved_tensors
    # The saved gradients are of the loss itself; autograd's incoming gradient scales them.
    return (dq_I * g_loss, dk_I * g_loss, dw * g_loss) + none


indexer_loss.register_autograd(_loss_backward, setup_context=_loss_setup_context)
