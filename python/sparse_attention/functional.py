"""User-facing functions: block_sparse_attention and deepseek_sparse_attention.

Both return outputs with autograd (the LSE is returned without gradient), run on the current
CUDA stream, and work under torch.compile(fullgraph=True) and CUDA graph capture. CPU tensors
run the library's fp64 reference (any float dtype, any head dim), which makes tiny gradient
checks possible; CUDA tensors run the GPU implementation that serves the shape, or raise
NotImplementedError naming what is missing.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi, _ops

_LAYOUTS = {"bhsd": _abi.SA_LAYOUT_BHSD, "bshd": _abi.SA_LAYOUT_BSHD}
_INT_DTYPES = (torch.int64, torch.int16, torch.int8, torch.uint8)
_INT32_MIN, _INT32_MAX = _abi.INT32_MIN, _abi.INT32_MAX


def _invalid(message: str) -> ValueError:
    return _abi._invalid(message)


# ---- Python-level argument checks ---------------------------------------------------------------
def _tensor(t, name: str, optional: bool = False) -> Optional[Tensor]:
    if t is None and optional:
        return None
    if not isinstance(t, Tensor):
        hint = ""
        if hasattr(t, "kv_indices") and hasattr(t, "BLOCK_SIZE"):
            hint = "; convert a FlexAttention BlockMask with bsa_metadata_from_flex_block_mask"
        raise TypeError("%s: expected a torch.Tensor%s, got %s%s"
                        % (name, " or None" if optional else "", type(t).__name__, hint))
    return t


def _int(value, name: str, optional: bool = False) -> Optional[int]:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        try:  # int, numpy integers, one-element integer tensors
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError("%s: expected an int%s, got %s %r"
                    % (name, " or None" if optional else "", type(value).__name__, value))


_MASKS = {
    None: _abi.SA_MASK_NONE,
    "none": _abi.SA_MASK_NONE,
    "causal": _abi.SA_MASK_CAUSAL,
    "window": _abi.SA_MASK_WINDOW,
    "causal_window": _abi.SA_MASK_CAUSAL_WINDOW,
}


def _mask_id(mask) -> int:
    """The C ABI's sa_mask of a `mask` argument (None or a name)."""
    if mask is not None and not isinstance(mask, str):
        raise TypeError("mask: expected a str or None, got %s" % type(mask).__name__)
    if mask not in _MASKS:
        raise _invalid("mask: expected None, 'none', 'causal', 'window' or 'causal_window', "
                       "got %r" % mask)
    return _MASKS[mask]


def _scale(scale, default_doc: str, name: str = "scale") -> float:
    """The user's scale (argument `name`): None is the default; any other value is the scale
    itself, so 0 (which the C ABI reads as "default") is refused rather than silently
    replaced."""
    if scale is None:
        return 0.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError("%s: expected a float or None, got %s" % (name, type(scale).__name__))
    scale = float(scale)
    if not (math.isfinite(scale) and _abi.SCALE_MIN <= abs(scale) <= _abi.SCALE_MAX):
        raise _invalid(
            "%s: expected None (the default %s) or a finite value with %.8g <= |%s| <= "
            "%.6g, got %r" % (name, default_doc, _abi.SCALE_MIN, name, _abi.SCALE_MAX, scale))
    return scale


def _layout_id(layout) -> int:
    if not isinstance(layout, str):
        raise TypeError("layout: expected 'bhsd' or 'bshd' (a str), got %s" % type(layout).__name__)
    key = layout.lower()
    if key not in _LAYOUTS:
        raise _invalid("layout: expected 'bhsd' or 'bshd', got %r" % (layout,))
    return _LAYOUTS[key]


# ---- integer tensors into the library's int32 ----------------------------------------------------
def _distinct(t: Tensor, fn):
    """fn applied to the distinct elements of t only: dimensions broadcast with stride 0 are
    narrowed to one element first and expanded back after (no copy of a broadcast tensor)."""
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        base = t[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                       for st, n in zip(t.stride(), t.shape))]
        return fn(base).expand(t.shape)
    return fn(t)


def _values_readable(t: Tensor, validate: bool) -> bool:
    # Reading values synchronises with the device, so only where that is free (CPU) or asked for
    # (validate); never while tracing or capturing.
    if t.device.type == "meta" or torch.compiler.is_compiling():
        return False
    fake = getattr(torch._subclasses, "FakeTensor", None)
    if fake is not None and isinstance(t, fake):
        return False
    if t.device.type == "cuda":
        return validate and not torch.cuda.is_current_stream_capturing()
    return t.device.type == "cpu"


_META_INDEX = {
    "sparsity.q2k_index": ("b", "h", "m", "slot"),
    "sparsity.q2k_count": ("b", "h", "m"),
    "sparsity.kv_block_len": ("n",),
    "options.cu_seqlens_q": ("b",),
    "options.cu_seqlens_k": ("b",),
}


def _slots_read(q2k_index: Tensor, q2k_count: Optional[Tensor], count: Optional[int]):
    """Which slots of q2k_index are read (a mask that broadcasts against it): the first count of
    each row. None when the shapes do not line up (the library then names the shape error)."""
    k_max = q2k_index.shape[-1]
    slots = torch.arange(k_max, device=q2k_index.device)
    if q2k_count is None:
        return slots < (k_max if count is None or count == -1 else max(0, min(count, k_max)))
    try:
        read = slots < q2k_count.clamp(0, k_max)[..., None]
        torch.broadcast_shapes(read.shape, q2k_index.shape)
        return read
    except RuntimeError:
        return None


def _bsa_meta_int32(t: Optional[Tensor], name: str, validate: bool,
                    read: Optional[Tensor] = None) -> Optional[Tensor]:
    """BSA metadata as int32. An int64 value outside int32 that the library would read (`read`:
    the mask of read entries, default all) is an error that names the entry
    (SA_ERROR_INVALID_METADATA) on the CPU, and on CUDA with validate; otherwise it saturates,
    which keeps it out of SPEC's range (the GPU fast path trusts the contract, as for int32)."""
    if t is None or t.dtype not in _INT_DTYPES:
        return t  # int32 as it is; other dtypes: the library names the argument and dtype
    if t.dtype == torch.int64:
        if t.numel() and _values_readable(t, validate):
            bad = _distinct(t, lambda x: (x < _INT32_MIN) | (x > _INT32_MAX))
            if read is not None:
                bad = bad & read
            if bool(bad.any()):
                where = [int(i) for i in bad.nonzero()[0]]
                labels = _META_INDEX[name]
                if name == "sparsity.kv_block_len" and t.dim() == 2:
                    labels = ("b", "n")
                if len(labels) != len(where):
                    labels = ["i%d" % i for i in range(len(where))]
                raise ValueError(
                    "SA_ERROR_INVALID_METADATA: %s[%s] = %d: outside the int32 range the "
                    "library reads (SPEC section 1 ranges)" % (
                        name, ", ".join("%s=%d" % lw for lw in zip(labels, where)),
                        int(t[tuple(where)])))
        return _distinct(t, lambda x: x.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32))
    return _distinct(t, lambda x: x.to(torch.int32))


def _topk_idx_int32(t: Tensor, kv: Tensor) -> Tensor:
    """topk_idx as int32 without wrapping: any int64 value outside int32 is outside
    [0, S_kv) too, an inactive slot (SPEC section 2), and becomes -1."""
    if t.dtype not in _INT_DTYPES:
        return t
    if t.dtype == torch.int64:
        rows = kv.shape[0] if kv.dim() >= 1 else 0
        if isinstance(rows, int) and rows > _INT32_MAX + 1:
            raise _invalid("kv: S_kv = %d rows, more than an int32 topk_idx can address; int64 "
                           "indices past 2^31 - 1 cannot be narrowed" % rows)
        return _distinct(t, lambda x: x.masked_fill((x < 0) | (x > _INT32_MAX), -1)
                         .to(torch.int32))
    return _distinct(t, lambda x: x.to(torch.int32))


def _topk_length_int32(t: Optional[Tensor]) -> Optional[Tensor]:
    """topk_length as int32 without wrapping: values are clamped to int32, which keeps SPEC's
    meaning (<= 0 an empty row, > topk read as topk)."""
    if t is None or t.dtype not in _INT_DTYPES:
        return t
    if t.dtype == torch.int64:
        return _distinct(t, lambda x: x.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32))
    return _distinct(t, lambda x: x.to(torch.int32))


def _inner_contiguous(t: Tensor) -> Tensor:
    # The library needs stride 1 on the last dimension; other strides are free.
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


def _broadcast_meta(t: Optional[Tensor], batch, heads) -> Optional[Tensor]:
    # [1, 1, ...] metadata (e.g. a FlexAttention BlockMask made with B=None, H=None) serves every
    # batch and head: expand the dimensions of size 1 (stride 0, no copy). Any other mismatch is
    # left for the library's shape check, which names the argument and the expected shape.
    if t is None or t.dim() < 2:
        return t
    b = batch if t.shape[0] == 1 else t.shape[0]
    h = heads if t.shape[1] == 1 else t.shape[1]
    if (b, h) != (t.shape[0], t.shape[1]):
        return t.expand(b, h, *t.shape[2:])
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
    mask: Optional[str] = None,
    causal_offset: Optional[int] = None,
    window_left: Optional[int] = None,
    window_right: Optional[int] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention (SPEC sections 1 and 4). Returns ``(o, lse)``.

    Args:
        q: ``[B, H_q, S_q, D]`` (layout ``"bhsd"``) or ``[B, S_q, H_q, D]`` (``"bshd"``).
        k: ``[B, H_kv, S_kv, D]``, v: ``[B, H_kv, S_kv, D_v]`` in the same layout;
            ``H_q % H_kv == 0`` (MHA, GQA, MQA). bf16/fp16 on CUDA; CPU also fp32/fp64.
        q2k_index: ``[B, H_q, N_q, K_max]`` integer: the KV blocks each query block attends
            (``N_q = ceil(S_q / block_size)``). B and H_q may be 1 to broadcast. int64 and
            smaller integer dtypes are converted to int32; a value outside int32 is an error
            (on CUDA: with ``validate``; otherwise it saturates and stays out of range).
        q2k_count: ``[B, H_q, N_q]`` integer in ``[0, K_max]``: how many entries of each row are
            read. Absent: ``count`` entries (default ``K_max``) for every row.
        block_size: 64 or 128 (query and KV blocks).
        kv_block_len: ``[N_kv]`` or ``[B, N_kv]`` valid tokens per KV block (default: full
            blocks, the last one cut at ``S_kv``).
        scale: softmax scale; None (the default) means ``1/sqrt(D)``. Any other value is used
            as given (negative allowed) and must be finite with ``1.18e-38 <= |scale| <=
            2.36e38`` (a normal fp32 number whose product with log2(e) is finite); 0 is refused.
        bucket_size: backward tuning: query blocks per group of a reverse row (0: automatic).
        deterministic: bitwise-reproducible gradients.
        validate: check the metadata values on the GPU first (synchronises; a debugging aid).
            The CPU reference always checks them.
        mask: a token mask inside the listed blocks: None or ``"none"``, ``"causal"``,
            ``"window"`` or ``"causal_window"``. With ``c = causal_offset`` (default
            ``S_kv - S_q``, bottom-right aligned), query ``i`` sees key ``s`` iff
            causal: ``s <= i + c``; window: ``i + c - window_left <= s <= i + c +
            window_right``; causal_window: ``i + c - window_left <= s <= i + c``. The library
            skips blocks the mask hides and masks only the blocks it cuts.
        causal_offset: the diagonal's offset (any int64); only with a mask.
        window_left, window_right: window sizes (``>= 0``); ``window_left`` is required by the
            window masks, ``window_right`` is for ``"window"`` only (default 0).
        cu_seqlens_q, cu_seqlens_k: a packed (variable-length) batch: ``[B + 1]`` integer
            offsets (both or neither), as in FlashAttention's varlen API. ``q`` is then
            ``[T_q, H_q, D]``, ``k`` ``[T_kv, H_kv, D]``, ``v`` ``[T_kv, H_kv, D_v]`` (``layout``
            does not apply), ``q2k_index`` ``[B, H_q, N_q_max, K_max]`` with KV block ids local
            to each sequence, ``o`` ``[T_q, H_q, D_v]`` and ``lse`` ``[H_q, T_q]``. Masks apply
            per sequence (the default offset is each sequence's ``S_kv - S_q``). No host
            synchronisation: N_q_max comes from ``q2k_index``'s shape.

    Returns:
        ``o`` (layout and dtype of ``q``, last dim ``D_v``) with autograd for q, k and v, and
        ``lse`` ``[B, H_q, S_q]`` fp32 (natural log; ``-inf`` for a row that sees no key),
        which carries no gradient.
    """
    mask_id = _mask_id(mask)
    causal_offset = _int(causal_offset, "causal_offset", optional=True)
    window_left = _int(window_left, "window_left", optional=True)
    window_right = _int(window_right, "window_right", optional=True)
    if mask_id in (_abi.SA_MASK_WINDOW, _abi.SA_MASK_CAUSAL_WINDOW) and window_left is None:
        raise _invalid("window_left: required by mask=%r (the keys before the diagonal that a "
                       "query sees, >= 0)" % mask)
    if mask_id == _abi.SA_MASK_NONE and causal_offset is not None:
        raise _invalid("causal_offset: given without a mask (mask=%r); pass mask=\"causal\", "
                       "\"window\" or \"causal_window\"" % mask)
    q, k, v = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
    q2k_index = _tensor(q2k_index, "q2k_index")
    q2k_count = _tensor(q2k_count, "q2k_count", optional=True)
    kv_block_len = _tensor(kv_block_len, "kv_block_len", optional=True)
    layout_id = _layout_id(layout)
    block_size = _int(block_size, "block_size")
    count = _int(count, "count", optional=True)
    bucket_size = _int(bucket_size, "bucket_size")
    scale = _scale(scale, "1/sqrt(D)")
    validate = bool(validate)
    if count is not None and q2k_count is not None:
        raise _invalid(
            "count: give either count (one count for every row) or q2k_count (one per row), "
            "not both"
        )
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    read = None  # entries past a row's count are never read: any value is fine there
    if (q2k_index.dtype == torch.int64 and q2k_index.dim() >= 1 and q2k_index.numel()
            and _values_readable(q2k_index, validate)
            and (q2k_count is None or q2k_count.dtype in (torch.int32,) + _INT_DTYPES)):
        read = _slots_read(q2k_index, q2k_count, count)
    q2k_count = _bsa_meta_int32(q2k_count, "sparsity.q2k_count", validate)
    q2k_index = _bsa_meta_int32(q2k_index, "sparsity.q2k_index", validate, read)
    kv_block_len = _bsa_meta_int32(kv_block_len, "sparsity.kv_block_len", validate)
    cu_seqlens_q = _bsa_meta_int32(_tensor(cu_seqlens_q, "cu_seqlens_q", optional=True),
                                   "options.cu_seqlens_q", validate)
    cu_seqlens_k = _bsa_meta_int32(_tensor(cu_seqlens_k, "cu_seqlens_k", optional=True),
                                   "options.cu_seqlens_k", validate)
    if cu_seqlens_q is not None and q.dim() == 3:
        heads = q.shape[1]
        q2k_index = _broadcast_meta(q2k_index, cu_seqlens_q.shape[0] - 1, heads)
        q2k_count = _broadcast_meta(q2k_count, cu_seqlens_q.shape[0] - 1, heads)
    elif q.dim() == 4:
        batch = q.shape[0]
        heads = q.shape[1] if layout_id == _abi.SA_LAYOUT_BHSD else q.shape[2]
        q2k_index = _broadcast_meta(q2k_index, batch, heads)
        q2k_count = _broadcast_meta(q2k_count, batch, heads)
    return _ops.bsa_fwd(
        q, k, v, q2k_index, q2k_count, kv_block_len,
        block_size, layout_id, -1 if count is None else count, scale,
        bucket_size, bool(deterministic), validate,
        mask_id, causal_offset, 0 if window_left is None else window_left,
        0 if window_right is None else window_right, cu_seqlens_q, cu_seqlens_k,
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
            outside ``[0, S_kv)`` (e.g. -1, or an int64 value outside int32) are inactive.
        topk_length: ``[S_q]`` integer: only the first ``topk_length[t]`` slots of row t are
            active (optional); ``<= 0`` is an empty row, ``> topk`` reads ``topk`` slots (int64
            values are clamped to int32, which keeps that meaning).
        sink: ``[H]`` per-head logit that joins the softmax denominator but has no value
            (optional; converted to fp32). Its gradient is computed. A NaN sink makes that
            head's ``out`` NaN on every non-empty row (like any NaN input); ``lse`` excludes it.
        d_v: value width, at least 1 and at most D_qk; None (the default) means 512.
        scale: softmax scale; None (the default) means ``1/sqrt(D_qk)``; other values as in
            ``block_sparse_attention`` (0 is refused).
        deterministic: bitwise-reproducible ``dkv`` and ``d_sink``.

    Returns:
        ``out`` ``[S_q, H, d_v]`` (dtype of q) with autograd for q, kv and sink, and ``lse``
        ``[S_q, H]`` fp32 (sink excluded; ``+inf`` for an empty row), without gradient.
    """
    q, kv = _tensor(q, "q"), _tensor(kv, "kv")
    topk_idx = _tensor(topk_idx, "topk_idx")
    topk_length = _tensor(topk_length, "topk_length", optional=True)
    sink = _tensor(sink, "sink", optional=True)
    # None goes to the C ABI as 0, its default (512), whose errors then say it was defaulted.
    d_v = _int(d_v, "d_v", optional=True)
    if d_v is not None and d_v < 1:  # the C ABI reads 0 as 512; a given value is the width
        d_qk = " = %d" % q.shape[-1] if q.dim() == 3 else ""
        raise _invalid("options.d_v: expected a value in [1, D_qk%s], got %d" % (d_qk, d_v))
    scale = _scale(scale, "1/sqrt(D_qk)")
    q, kv = _inner_contiguous(q), _inner_contiguous(kv)
    topk_idx, topk_length = _topk_idx_int32(topk_idx, kv), _topk_length_int32(topk_length)
    if sink is not None and sink.dtype != torch.float32 and sink.is_floating_point():
        sink = sink.to(torch.float32)
    return _ops.dsa_fwd(q, kv, topk_idx, topk_length, sink, 0 if d_v is None else d_v, scale,
                        bool(deterministic))
