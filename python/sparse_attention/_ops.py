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

import re
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi

_NS = "sparse_attention"


# ---- BSA ----------------------------------------------------------------------------------------
def _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate,
                 mask=0, causal_offset=None, window_left=0, window_right=0):
    # Every value is range-checked before ctypes narrows it (it would keep the low 32 bits).
    o = _abi.sa_bsa_options()
    o.mask = _abi.int32_option(mask, "options.mask", "SA_MASK_NONE .. SA_MASK_CAUSAL_WINDOW")
    o.causal_offset_given = int(causal_offset is not None)
    o.causal_offset = 0 if causal_offset is None else _abi.int64_option(
        causal_offset, "options.causal_offset", "an int64")
    o.window_left = _abi.int64_option(window_left, "options.window_left", ">= 0")
    o.window_right = _abi.int64_option(window_right, "options.window_right", ">= 0")
    o.scale = _abi.scale_option(scale, "1/sqrt(D)")
    o.layout = _abi.int32_option(layout, "options.layout", "SA_LAYOUT_BHSD or SA_LAYOUT_BSHD")
    o.block_size = _abi.int32_option(block_size, "options.block_size", "64 or 128")
    o.count = _abi.int32_option(count, "options.count", "-1 (K_max) or a value in [0, K_max]")
    o.bucket_size = _abi.int32_option(bucket_size, "options.bucket_size",
                                      ">= 0 (0 = automatic)")
    o.validate = int(bool(validate))
    o.deterministic = int(bool(deterministic))
    o.impl = _abi.SA_IMPL_AUTO
    return o


def _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only):
    s = _abi.sa_bsa_sparsity()
    s.q2k_index = _abi.view(q2k_index, shape_only, "sparsity.q2k_index")
    s.q2k_count = _abi.view(q2k_count, shape_only, "sparsity.q2k_count")
    s.kv_block_len = _abi.view(kv_block_len, shape_only, "sparsity.kv_block_len")
    return s


def _same_device(**tensors) -> None:
    """Every tensor of a call on one device (the first one's). Meta dispatch (the fake kernels)
    is chosen when any input is a meta tensor; mixing it with real tensors is an error, not a
    shape-only call."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise _abi._invalid("%s: expected device %s like %s, got %s"
                                % (name, first[1], first[0], t.device))


def _lse_shape(x: Tensor, layout: int):
    # [B, H, S] from an attention tensor in `layout`
    if layout == _abi.SA_LAYOUT_BSHD:
        return (x.shape[0], x.shape[2], x.shape[1])
    return (x.shape[0], x.shape[1], x.shape[2])


def _with_cu_seqlens(options, cu_seqlens_q, cu_seqlens_k, shape_only):
    """A copy of `options` with the packed batch's offsets (absent: a dense batch). They are set
    per call, after the options' bytes keyed the shape cache (their shapes key it instead)."""
    o = _abi.sa_bsa_options.from_buffer_copy(options)
    o.cu_seqlens_q = _abi.view(cu_seqlens_q, shape_only, "options.cu_seqlens_q")
    o.cu_seqlens_k = _abi.view(cu_seqlens_k, shape_only, "options.cu_seqlens_k")
    return o


def _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse, options, shape_only,
                  cu_seqlens_q=None, cu_seqlens_k=None):
    a = _abi.sa_bsa_fwd_args()
    a.q = _abi.view(q, shape_only, "q")
    a.k = _abi.view(k, shape_only, "k")
    a.v = _abi.view(v, shape_only, "v")
    a.sparsity = _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only)
    a.o = _abi.view(o, shape_only, "o")
    a.lse = _abi.view(lse, shape_only, "lse")
    a.options = _with_cu_seqlens(options, cu_seqlens_q, cu_seqlens_k, shape_only)
    return a


def _block_size_hint(error: ValueError, q, q2k_index, options) -> ValueError:
    """The library's q2k_index shape error, with the likely cause when N_q fits the other block
    size: metadata made for 64-token blocks (a FlexAttention BlockMask created with
    BLOCK_SIZE=64) passed with the default block_size 128, or the other way round."""
    message = str(error)
    if ("sparsity.q2k_index: expected shape" not in message or q.dim() != 4
            or q2k_index.dim() != 4 or options.block_size not in (64, 128)):
        return error
    s_q = q.shape[1] if options.layout == _abi.SA_LAYOUT_BSHD else q.shape[2]
    other = 192 - options.block_size
    n_other = -(-s_q // other)
    if q2k_index.shape[2] != n_other or n_other == -(-s_q // options.block_size):
        return error
    hint = ("; N_q = %d = ceil(S_q / %d): metadata for %d-token blocks (a FlexAttention "
            "BlockMask created with BLOCK_SIZE=%d?) needs block_size=%d"
            % (n_other, other, other, other, other))
    where = re.search(r" \[[^\[\]]+:\d+\]$", message)  # the library's " [file:line]" stays last
    at = where.start() if where else len(message)
    return ValueError(message[:at] + hint + message[at:])


def _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, options, fake=False,
                     cu_seqlens_q=None, cu_seqlens_k=None):
    """Validates the call's shapes with the library (no data read, nothing allocated), then
    allocates o and lse. Returns (o, lse)."""
    o_shape = lse_shape = None
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed and q.dim() == 3 and v.dim() == 3:  # THD: o [T_q, H_q, D_v], lse [H_q, T_q]
        o_shape = (q.shape[0], q.shape[1], v.shape[2])
        lse_shape = (q.shape[1], q.shape[0])
    elif not packed and q.dim() == 4 and v.dim() == 4:
        o_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        lse_shape = _lse_shape(q, options.layout)
    inputs = (q, k, v, q2k_index, q2k_count, kv_block_len, cu_seqlens_q, cu_seqlens_k)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        try:
            _abi.validate_shapes_once("bsa_forward", options, inputs, lambda: _bsa_fwd_args(
                q, k, v, q2k_index, q2k_count, kv_block_len, _abi.Planned.of(o_shape, q.dtype),
                _abi.Planned.of(lse_shape, torch.float32), options, True, cu_seqlens_q,
                cu_seqlens_k))
        except ValueError as e:
            raise _block_size_hint(e, q, q2k_index, options) from None
    if o_shape is None:  # symbolic shapes of the wrong rank
        raise _abi._invalid("q and v: expected rank %d, got %d and %d"
                            % (3 if packed else 4, q.dim(), v.dim()))
    return q.new_empty(o_shape), q.new_empty(lse_shape, dtype=torch.float32)


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
    mask: int = 0,
    causal_offset: Optional[int] = None,
    window_left: int = 0,
    window_right: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate,
                        mask, causal_offset, window_left, window_right)
    o, lse = _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, opts,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    args = _bsa_fwd_args(q, k, v, q2k_index, q2k_count, kv_block_len, o, lse, opts, False,
                         cu_seqlens_q, cu_seqlens_k)
    _abi.run("bsa_forward", args, q.device)
    return o, lse


@bsa_fwd.register_fake
def _bsa_fwd_fake(q, k, v, q2k_index, q2k_count, kv_block_len, block_size, layout, count, scale,
                  bucket_size, deterministic, validate, mask=0, causal_offset=None,
                  window_left=0, window_right=0, cu_seqlens_q=None, cu_seqlens_k=None):
    _same_device(q=q, k=k, v=v, q2k_index=q2k_index, q2k_count=q2k_count,
                 kv_block_len=kv_block_len, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate,
                        mask, causal_offset, window_left, window_right)
    return _bsa_fwd_outputs(q, k, v, q2k_index, q2k_count, kv_block_len, opts, fake=True,
                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


def _bsa_bwd_args(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv, options,
                  shape_only, cu_seqlens_q=None, cu_seqlens_k=None):
    a = _abi.sa_bsa_bwd_args()
    a.q = _abi.view(q, shape_only, "q")
    a.k = _abi.view(k, shape_only, "k")
    a.v = _abi.view(v, shape_only, "v")
    a.o = _abi.view(o, shape_only, "o")
    a.lse = _abi.view(lse, shape_only, "lse")
    a.dout = _abi.view(dout, shape_only, "dout")
    a.sparsity = _bsa_sparsity(q2k_index, q2k_count, kv_block_len, shape_only)
    a.dq = _abi.view(dq, shape_only, "dq")
    a.dk = _abi.view(dk, shape_only, "dk")
    a.dv = _abi.view(dv, shape_only, "dv")
    a.options = _with_cu_seqlens(options, cu_seqlens_q, cu_seqlens_k, shape_only)
    return a


def _bsa_bwd_outputs(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, options,
                     fake=False, cu_seqlens_q=None, cu_seqlens_k=None):
    """Validates the call's shapes (nothing allocated yet), then allocates dq, dk, dv."""
    inputs = (dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, cu_seqlens_q,
              cu_seqlens_k)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        try:
            _abi.validate_shapes_once("bsa_backward", options, inputs, lambda: _bsa_bwd_args(
                dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len,
                *(_abi.Planned(t.shape, t.dtype) for t in (q, k, v)), options, True,
                cu_seqlens_q, cu_seqlens_k))
        except ValueError as e:
            raise _block_size_hint(e, q, q2k_index, options) from None
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


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
    mask: int = 0,
    causal_offset: Optional[int] = None,
    window_left: int = 0,
    window_right: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate,
                        mask, causal_offset, window_left, window_right)
    dq, dk, dv = _bsa_bwd_outputs(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, opts,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    args = _bsa_bwd_args(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, dq, dk, dv,
                         opts, False, cu_seqlens_q, cu_seqlens_k)
    _abi.run("bsa_backward", args, q.device)
    return dq, dk, dv


@bsa_bwd.register_fake
def _bsa_bwd_fake(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, block_size, layout,
                  count, scale, bucket_size, deterministic, validate, mask=0, causal_offset=None,
                  window_left=0, window_right=0, cu_seqlens_q=None, cu_seqlens_k=None):
    _same_device(dout=dout, q=q, k=k, v=v, o=o, lse=lse, q2k_index=q2k_index,
                 q2k_count=q2k_count, kv_block_len=kv_block_len, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k)
    opts = _bsa_options(block_size, layout, count, scale, bucket_size, deterministic, validate,
                        mask, causal_offset, window_left, window_right)
    return _bsa_bwd_outputs(dout, q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, opts,
                            fake=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


def _bsa_setup_context(ctx, inputs, output):
    (q, k, v, q2k_index, q2k_count, kv_block_len, block_size, layout, count, scale, bucket_size,
     deterministic, validate, mask, causal_offset, window_left, window_right, cu_seqlens_q,
     cu_seqlens_k) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, cu_seqlens_q,
                          cu_seqlens_k)
    ctx.options = (block_size, layout, count, scale, bucket_size, deterministic, validate, mask,
                   causal_offset, window_left, window_right)
    ctx.mark_non_differentiable(lse)


def _bsa_backward(ctx, do, dlse):
    q, k, v, o, lse, q2k_index, q2k_count, kv_block_len, cu_q, cu_k = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    # The library needs a contiguous last dimension; autograd may hand over expanded gradients.
    dq, dk, dv = bsa_bwd(do.contiguous(), q, k, v, o, lse, q2k_index, q2k_count, kv_block_len,
                         *ctx.options, cu_q, cu_k)
    return (dq, dk, dv) + (None,) * 16


bsa_fwd.register_autograd(_bsa_backward, setup_context=_bsa_setup_context)


# ---- DSA ----------------------------------------------------------------------------------------
def _dsa_options(d_v, scale, deterministic):
    o = _abi.sa_dsa_options()
    o.scale = _abi.scale_option(scale, "1/sqrt(D_qk)")
    o.d_v = _abi.int32_option(d_v, "options.d_v", "a value in [1, D_qk] (0 for 512)")
    o.deterministic = int(bool(deterministic))
    o.impl = _abi.SA_IMPL_AUTO
    return o


def _dsa_fwd_args(q, kv, topk_idx, topk_length, sink, out, lse, options, shape_only):
    a = _abi.sa_dsa_fwd_args()
    a.q = _abi.view(q, shape_only, "q")
    a.kv = _abi.view(kv, shape_only, "kv")
    a.topk_idx = _abi.view(topk_idx, shape_only, "topk_idx")
    a.topk_length = _abi.view(topk_length, shape_only, "topk_length")
    a.sink = _abi.view(sink, shape_only, "sink")
    a.out = _abi.view(out, shape_only, "out")
    a.lse = _abi.view(lse, shape_only, "lse")
    a.options = options
    return a


def _dsa_fwd_outputs(q, kv, topk_idx, topk_length, sink, options, fake=False):
    """Validates the call's shapes (nothing allocated yet), then allocates out and lse."""
    out_shape = lse_shape = None
    if q.dim() == 3:
        d_v = options.d_v if options.d_v != 0 else 512
        out_shape, lse_shape = (q.shape[0], q.shape[1], d_v), (q.shape[0], q.shape[1])
    inputs = (q, kv, topk_idx, topk_length, sink)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        _abi.validate_shapes_once("dsa_forward", options, inputs, lambda: _dsa_fwd_args(
            q, kv, topk_idx, topk_length, sink, _abi.Planned.of(out_shape, q.dtype),
            _abi.Planned.of(lse_shape, torch.float32), options, True))
    if out_shape is None:  # symbolic shapes of the wrong rank
        raise _abi._invalid("q: expected rank 3, got rank %d" % q.dim())
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


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
    _same_device(q=q, kv=kv, topk_idx=topk_idx, topk_length=topk_length, sink=sink)
    opts = _dsa_options(d_v, scale, deterministic)
    return _dsa_fwd_outputs(q, kv, topk_idx, topk_length, sink, opts, fake=True)


def _dsa_bwd_args(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink, options,
                  shape_only):
    a = _abi.sa_dsa_bwd_args()
    a.q = _abi.view(q, shape_only, "q")
    a.kv = _abi.view(kv, shape_only, "kv")
    a.topk_idx = _abi.view(topk_idx, shape_only, "topk_idx")
    a.topk_length = _abi.view(topk_length, shape_only, "topk_length")
    a.sink = _abi.view(sink, shape_only, "sink")
    a.out = _abi.view(out, shape_only, "out")
    a.lse = _abi.view(lse, shape_only, "lse")
    a.dout = _abi.view(dout, shape_only, "dout")
    a.dq = _abi.view(dq, shape_only, "dq")
    a.dkv = _abi.view(dkv, shape_only, "dkv")
    a.d_sink = _abi.view(d_sink, shape_only, "d_sink")
    a.options = options
    return a


def _dsa_bwd_outputs(dout, q, kv, out, lse, topk_idx, topk_length, sink, options, fake=False):
    """Validates the call's shapes (nothing allocated yet), then allocates dq, dkv, d_sink."""
    inputs = (dout, q, kv, out, lse, topk_idx, topk_length, sink)
    if not fake or _abi.can_describe(*inputs):  # fake: maybe symbolic
        _abi.validate_shapes_once("dsa_backward", options, inputs, lambda: _dsa_bwd_args(
            dout, q, kv, out, lse, topk_idx, topk_length, sink, _abi.Planned(q.shape, q.dtype),
            _abi.Planned(kv.shape, kv.dtype),
            _abi.Planned((q.shape[1],) if q.dim() >= 2 else (1,), torch.float32), options, True))
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
    dq, dkv, d_sink = _dsa_bwd_outputs(dout, q, kv, out, lse, topk_idx, topk_length, sink, opts)
    args = _dsa_bwd_args(dout, q, kv, out, lse, topk_idx, topk_length, sink, dq, dkv, d_sink, opts,
                         False)
    _abi.run("dsa_backward", args, q.device)
    return dq, dkv, d_sink


@dsa_bwd.register_fake
def _dsa_bwd_fake(dout, q, kv, out, lse, topk_idx, topk_length, sink, d_v, scale, deterministic):
    _same_device(dout=dout, q=q, kv=kv, out=out, lse=lse, topk_idx=topk_idx,
                 topk_length=topk_length, sink=sink)
    opts = _dsa_options(d_v, scale, deterministic)
    return _dsa_bwd_outputs(dout, q, kv, out, lse, topk_idx, topk_length, sink, opts, fake=True)


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
