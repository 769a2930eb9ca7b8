"""The four operations as torch.library custom operators, with fake (meta) kernels and autograd.

    sparse_attention::bsa_fwd, sparse_attention::bsa_bwd,
    sparse_attention::dsa_fwd, sparse_attention::dsa_bwd

Each operator returns new tensors (mutates_args=()), so torch.compile sees a functional,
opaque call: no graph break, and AOTAutograd traces forward and backward through the fake
kernels. The real kernels call the C ABI on the current CUDA stream (CPU tensors: the fp64
reference). The forward operators carry the backward-only options (bucket_size,
deterministic) so that the autograd formula can pass them on.

Outputs are contiguous tensors in the shapes of SPEC.md. The LSE outputs are not differentiable
(SPEC's backward has no dLSE input); their gradient is ignored.

(No `from __future__ import annotations` here: torch.library reads the annotations.)
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi

_NS = "sparse_attention"


# ---- BSA ----------------------------------------------------------------------------------------
def _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate):
    o = _abi.sa_bsa_options()
    o.scale = scale
    o.layout = layout
    o.block_size = block_size
    o.count = count
    o.bucket_size = bucket_size
    o.validate = int(validate)
    o.deterministic = int(deterministic)
    o.impl = _abi.SA_IMPL_AUTO
    return o


def _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only):
    s = _abi.sa_bsa_sparsity()
    s.q2k_index = _abi.view(q2k_index, shape_only)
    s.q2k_count = _abi.view(q2k_count, shape_only)
    s.kv_block_len = _abi.view(kv_block_len, shape_only)
    return s


def _lse_shape(x: Tensor, layout: int):
    # [B, H, S] from an attention tensor in `layout`
    if layout == _abi.SA_LAYOUT_BSHD:
        return (x.shape[0], x.shape[2], x.shape[1])
    return (x.shape[0], x.shape[1], x.shape[2])


def _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse, options, shape_only):
    a = _abi.sa_bsa_fwd_args()
    a.q = _abi.view(q, shape_only)
    a.k = _abi.view(k, shape_only)
    a.v = _abi.view(v, shape_only)
    a.sparsity = _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only)
    a.o = _abi.view(o, shape_only)
    a.lse = _abi.view(lse, shape_only)
    a.options = options
    return a


def _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, options):
    """Allocates o and lse; when their shapes cannot be derived (wrong ranks), lets the library
    report what is wrong. Returns (o, lse)."""
    if q.dim() != 4 or v.dim() != 4:
        _abi.validate_shapes(
            "bsa_forward",
            _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, None, None, options, True),
        )
        raise ValueError("SA_ERROR_INVALID_ARGUMENT: q and v must have rank 4")  # not reached
    o = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
    lse = q.new_empty(_lse_shape(q, options.layout), dtype=torch.float32)
    return o, lse


@torch.library.custom_op(_NS + "::bsa_fwd", mutates_args=())
def bsa_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q2k_index: Tensor,
    q2k_count: Optional[Tensor],
    kv_block_len: Optional[Tensor],
    block_size: int,
    layout: int,
    count: int,
    scale: float,
    bucket_size: int,
    deterministic: bool,
    validate: bool,
) -> Tuple[Tensor, Tensor]:
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate)
    o, lse = _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, opts)
    args = _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse, opts, False)
    _abi.run("bsa_forward", args, q.device)
    return o, lse


@bsa_fwd.register_fake
def _bsa_fwd_fake(q, k, v, q2k_index, q2k_count, kv_block_len, block_size, layout, count, scale,
                  bucket_size, deterministic, validate):
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate)
    o, lse = _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, opts)
    if _abi.can_describe(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse):
        _abi.validate_shapes(
            "bsa_forward",
            _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse, opts, True),
        )
    return o, lse


def _bsa_bwd_args(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv, options,
                  shape_only):
    a = _abi.sa_bsa_bwd_args()
    a.q = _abi.view(q, shape_only)
    a.k = _abi.view(k, shape_only)
    a.v = _abi.view(v, shape_only)
    a.o = _abi.view(o, shape_only)
    a.lse = _abi.view(lse, shape_only)
    a.dout = _abi.view(dout, shape_only)
    a.sparsity = _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only)
    a.dq = _abi.view(dq, shape_only)
    a.dk = _abi.view(dk, shape_only)
    a.dv = _abi.view(dv, shape_only)
    a.options = options
    return a


@torch.library.custom_op(_NS + "::bsa_bwd", mutates_args=())
def bsa_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    q2k_index: Tensor,
    q2k_count: Optional[Tensor],
    kv_block_len: Optional[Tensor],
    block_size: int,
    layout: int,
    count: int,
    scale: float,
    bucket_size: int,
    deterministic: bool,
    validate: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    args = _bsa_bwd_args(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv,
                         opts, False)
    _abi.run("bsa_backward", args, q.device)
    return dq, dk, dv


@bsa_bwd.register_fake
def _bsa_bwd_fake(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, block_size, layout,
                  count, scale, bucket_size, deterministic, validate):
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if _abi.can_describe(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv):
        _abi.validate_shapes(
            "bsa_backward",
            _bsa_bwd_args(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv,
                          opts, True),
        )
    return dq, dk, dv


def _bsa_setup_context(ctx, inputs, output):
    (q, k, v, q2k_index, q2k_count, kv_block_len, block_size, layout, count, scale, bucket_size,
     deterministic, validate) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, q2k_index, q2k_count, kv_block_len)
    ctx.options = (block_size, layout, count, scale, bucket_size, deterministic, validate)
    ctx.mark_non_differentiable(lse)


def _bsa_backward(ctx, do, dlse):
    q, k, v, o, lse, q2k_index, q2k_count, kv_block_len = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    # The library needs a contiguous last dimension; autograd may hand over expanded gradients.
    dq, dk, dv = bsa_bwd(do.contiguous(), q, k, v, o, lse, q2k_index, q2k_count, kv_block_len,
                         *ctx.options)
    return (dq, dk, dv) + (None,) * 10


bsa_fwd.register_autograd(_bsa_backward, setup_context=_bsa_setup_context)


# ---- DSA ----------------------------------------------------------------------------------------
def _dsa_options(d_v, scale, deterministic):
    o = _abi.sa_dsa_options()
    o.scale = scale
    o.d_v = d_v
    o.deterministic = int(deterministic)
    o.impl = _abi.SA_IMPL_AUTO
    return o


def _dsa_fwd_args(q, kv, topk_idx, topk_length, sink, out, lse, options, shape_only):
    a = _abi.sa_dsa_fwd_args()
    a.q = _abi.view(q, shape_only)
    a.kv = _abi.view(kv, shape_only)
    a.topk_idx = _abi.view(topk_idx, shape_only)
    a.topk_length = _abi.view(topk_length, shape_only)
    a.sink = _abi.view(sink, shape_only)
    a.out = _abi.view(out, shape_only)
    a.lse = _abi.view(lse, shape_only)
    a.options = options
    return a


def _dsa_fwd_outputs(q, kv, topk_idx, topk_length, sink, options):
    if q.dim() != 3:
        _abi.validate_shapes(
            "dsa_forward",
            _dsa_fwd_args(q, kv, topk_idx, topk_length, sink, None, None, options, True),
        )
        raise ValueError("SA_ERROR_INVALID_ARGUMENT: q must have rank 3")  # not reached
    d_v = options.d_v if options.d_v != 0 else 512
    out = q.new_empty((q.shape[0], q.shape[1], d_v))
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op(_NS + "::dsa_fwd", mutates_args=())
def dsa_fwd(
    q: Tensor,
    kv: Tensor,
    topk_idx: Tensor,
    topk_length: Optional[Tensor],
    sink: Optional[Tensor],
    d_v: int,
    scale: float,
    deterministic: bool,
) -> Tuple[Tensor, Tensor]:
    opts = _dsa_options(d_v, scale, deterministic)
    out, lse = _dsa_fwd_outputs(q, kv, topk_idx, topk_length, sink, opts)
    args = _dsa_fwd_args(q, kv, topk_idx, topk_length, sink, out, lse, opts, False)
    _abi.run("dsa_forward", args, q.device)
    return out, lse


@dsa_fwd.register_fake
def _dsa_fwd_fake(q, kv, topk_idx, topk_length, sink, d_v, scale, deterministic):
    opts = _dsa_options(d_v, scale, deterministic)
    out, lse = _dsa_fwd_outputs(q, kv, topk_idx, topk_length, sink, opts)
    if _abi.can_describe(q, kv, topk_idx, topk_length, sink, out, lse):
        _abi.validate_shapes(
            "dsa_forward", _dsa_fwd_args(q, kv, topk_idx, topk_length, sink, out, lse, opts, True)
        )
    return out, lse


def _dsa_bwd_args(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink, options,
                  shape_only):
    a = _abi.sa_dsa_bwd_args()
    a.q = _abi.view(q, shape_only)
    a.kv = _abi.view(kv, shape_only)
    a.topk_idx = _abi.view(topk_idx, shape_only)
    a.topk_length = _abi.view(topk_length, shape_only)
    a.sink = _abi.view(sink, shape_only)
    a.out = _abi.view(out, shape_only)
    a.lse = _abi.view(lse, shape_only)
    a.dout = _abi.view(dout, shape_only)
    a.dq = _abi.view(dq, shape_only)
    a.dkv = _abi.view(dkv, shape_only)
    a.d_sink = _abi.view(d_sink, shape_only)
    a.options = options
    return a


def _dsa_bwd_outputs(q, kv):
    return (q.new_empty(q.shape), kv.new_empty(kv.shape),
            q.new_empty((q.shape[1],), dtype=torch.float32))


@torch.library.custom_op(_NS + "::dsa_bwd", mutates_args=())
def dsa_bwd(
    dout: Tensor,
    q: Tensor,
    kv: Tensor,
    out: Tensor,
    lse: Tensor,
    topk_idx: Tensor,
    topk_length: Optional[Tensor],
    sink: Optional[Tensor],
    d_v: int,
    scale: float,
    deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    opts = _dsa_options(d_v, scale, deterministic)
    dq, dkv, d_sink = _dsa_bwd_outputs(q, kv)
    args = _dsa_bwd_args(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink, opts,
                         False)
    _abi.run("dsa_backward", args, q.device)
    return dq, dkv, d_sink


@dsa_bwd.register_fake
def _dsa_bwd_fake(dout, q, kv, out, lse, topk_idx, topk_length, sink, d_v, scale, deterministic):
    opts = _dsa_options(d_v, scale, deterministic)
    dq, dkv, d_sink = _dsa_bwd_outputs(q, kv)
    if _abi.can_describe(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink):
        _abi.validate_shapes(
            "dsa_backward",
            _dsa_bwd_args(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink,
                          opts, True),
        )
    return dq, dkv, d_sink


def _dsa_setup_context(ctx, inputs, output):
    q, kv, topk_idx, topk_length, sink, d_v, scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, kv, out, lse, topk_idx, topk_length, sink)
    ctx.options = (d_v, scale, deterministic)
    ctx.has_sink = sink is not None
    ctx.mark_non_differentiable(lse)


def _dsa_backward(ctx, dout, dlse):
    q, kv, out, lse, topk_idx, topk_length, sink = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dkv, d_sink = dsa_bwd(dout.contiguous(), q, kv, out, lse, topk_idx, topk_length, sink,
                              *ctx.options)
    return dq, dkv, None, None, (d_sink if ctx.has_sink else None), None, None, None


dsa_fwd.register_autograd(_dsa_backward, setup_context=_dsa_setup_context)
