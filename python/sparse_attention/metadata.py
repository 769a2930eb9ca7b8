"""BSA metadata (q2k_index, q2k_count) from a dense block mask or a FlexAttention BlockMask.

Both helpers run on the mask's device with tensor operations only: no host synchronisation
(unless ``k_max`` asks for a check), so they can be captured or compiled with the attention.
Entries past a row's count are padding, which the library never reads (it reads only the first
``count`` entries of a row).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def _compact(indices: Tensor, valid: Tensor) -> Tensor:
    # Moves the valid entries of each row to its front, keeping their order.
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    return torch.gather(indices, -1, order)


def bsa_metadata_from_block_mask(
    block_mask: Tensor, k_max: Optional[int] = None
) -> Tuple[Tensor, Tensor]:
    """``(q2k_index, q2k_count)`` from a boolean block mask ``[B, H, N_q, N_kv]``:
    query block ``m`` of head ``h`` attends KV block ``n`` iff ``block_mask[b, h, m, n]``.

    ``q2k_index`` is ``[B, H, N_q, k_max]`` int32 (each row's blocks in increasing order, then
    padding that the library never reads; past ``N_kv`` the padding is -1) and ``q2k_count``
    ``[B, H, N_q]`` int32. ``k_max`` defaults to ``N_kv`` (no host synchronisation); a smaller
    ``k_max`` must hold every row and is checked (which synchronises with the device); a larger
    one pads every row to that width.
    """
    if not isinstance(block_mask, torch.Tensor):
        raise TypeError(
            "block_mask: expected a [B, H, N_q, N_kv] boolean torch.Tensor, got %s%s" % (
                type(block_mask).__name__,
                "; for a FlexAttention BlockMask use bsa_metadata_from_flex_block_mask"
                if hasattr(block_mask, "kv_indices") else "")
        )
    if k_max is not None and (isinstance(k_max, bool) or not isinstance(k_max, int)):
        raise TypeError("k_max: expected an int or None, got %s %r" % (type(k_max).__name__, k_max))
    if block_mask.dim() != 4:
        raise ValueError(
            "block_mask: expected a [B, H, N_q, N_kv] mask, got shape %s" % (tuple(block_mask.shape),)
        )
    if k_max is not None and not 1 <= k_max <= 2**31 - 1:
        raise ValueError("k_max: expected a value in [1, 2147483647], got %d" % k_max)
    mask = block_mask if block_mask.dtype == torch.bool else block_mask != 0
    n_kv = mask.shape[-1]
    count = mask.sum(dim=-1, dtype=torch.int32)
    blocks = torch.arange(n_kv, device=mask.device, dtype=torch.int32).expand(mask.shape)
    index = _compact(blocks, mask)
    if k_max is not None and k_max < n_kv:
        widest = int(count.max()) if count.numel() else 0
        if widest > k_max:
            raise ValueError(
                "k_max: a row attends %d blocks, more than k_max = %d" % (widest, k_max)
            )
        index = index[..., :k_max]
    elif k_max is not None and k_max > n_kv:
        index = torch.nn.functional.pad(index, (0, k_max - n_kv), value=-1)
    return index.contiguous(), count


_MASK_NAMES = ("none", "causal", "window", "causal_window")


def _mask_band(mask, causal_offset, window_left, window_right, s_q, s_kv):
    """(lo, hi): key s is visible to query i iff lo <= s - i <= hi (SPEC 4), clamped to
    [-S_q, S_kv] like the library's."""
    c = s_kv - s_q if causal_offset is None else int(causal_offset)
    lo, hi = -s_q, s_kv
    if mask in ("causal", "causal_window"):
        hi = c
    if mask == "window":
        hi = c + int(window_right or 0)
    if mask in ("window", "causal_window"):
        lo = c - int(window_left or 0)
    return max(min(lo, s_kv), -s_q), max(min(hi, s_kv), -s_q)


def _block_classes(n_q, n_kv, block, s_q, s_kv, lo, hi, device):
    """[N_q, N_kv] int: 0 when the band holds every (query, key) pair of the block pair (inside
    S_q x S_kv), 2 when it holds none, 1 when it cuts it."""
    m = torch.arange(n_q, device=device, dtype=torch.int64)[:, None]
    n = torch.arange(n_kv, device=device, dtype=torch.int64)[None, :]
    r0, r1 = m * block, torch.clamp((m + 1) * block, max=s_q) - 1
    k0, k1 = n * block, torch.clamp((n + 1) * block, max=s_kv) - 1
    dmin, dmax = k0 - r1, k1 - r0
    outside = (dmax < lo) | (dmin > hi)
    inside = (dmin >= lo) & (dmax <= hi)
    return torch.where(outside, 2, torch.where(inside, 0, 1))


def bsa_metadata_from_flex_block_mask(
    block_mask,
    mask: Optional[str] = None,
    *,
    causal_offset: Optional[int] = None,
    window_left: Optional[int] = None,
    window_right: Optional[int] = None,
) -> Tuple[Tensor, Tensor]:
    """``(q2k_index, q2k_count)`` from a FlexAttention ``BlockMask``
    (``torch.nn.attention.flex_attention.create_block_mask``), for
    ``block_sparse_attention`` with the same ``mask`` arguments.

    The KV blocks of a query block are the union of the BlockMask's partial blocks
    (``kv_num_blocks``/``kv_indices``, where FlexAttention applies the ``mask_mod``) and full
    blocks (``full_kv_num_blocks``/``full_kv_indices``), in one list. BSA cannot run the
    ``mask_mod``; inside the listed blocks it applies its token ``mask`` (SPEC 4) instead:
    pass the ``mask`` (``"causal"``, ``"window"``, ``"causal_window"``, with
    ``causal_offset``, ``window_left``, ``window_right``) that equals the ``mask_mod``, here and
    to ``block_sparse_attention``. FlexAttention's usual causal ``mask_mod``,
    ``q_idx >= kv_idx``, is ``mask="causal"`` with ``causal_offset=0`` (the library's default
    offset is ``S_kv - S_q``: the same when ``S_q == S_kv``).

    - ``mask=None`` and a BlockMask with partial blocks is an error: BSA would attend the whole
      of each partial block (a superset of FlexAttention's pairs). A BlockMask with full blocks
      only (block-granular) needs no mask.
    - ``mask="none"`` accepts that superset explicitly.
    - With a mask, every full block must lie entirely inside it, and no partial block may lie
      entirely outside it, nor (except at the sequence's end, where the BlockMask's padding makes
      blocks partial) entirely inside it: otherwise the ``mask_mod`` and ``mask`` disagree and
      this is an error naming the block.

    The BlockMask's Q and KV block sizes must be equal (64 or 128): pass that as
    ``block_size``. Batch or head dimensions of size 1 broadcast in ``block_sparse_attention``.
    The partial-block checks read the BlockMask's values (one host synchronisation).
    """
    if mask is not None and mask not in _MASK_NAMES:
        raise ValueError("mask: expected None, 'none', 'causal', 'window' or 'causal_window', "
                         "got %r" % (mask,))
    if isinstance(block_mask, torch.Tensor) or not hasattr(block_mask, "BLOCK_SIZE"):
        raise TypeError(
            "block_mask: expected a FlexAttention BlockMask (from torch.nn.attention."
            "flex_attention.create_block_mask), got %s%s" % (
                type(block_mask).__name__,
                "; for a boolean [B, H, N_q, N_kv] block mask use bsa_metadata_from_block_mask"
                if isinstance(block_mask, torch.Tensor) else "")
        )
    bs_q, bs_kv = (int(b) for b in block_mask.BLOCK_SIZE)
    if bs_q != bs_kv or bs_q not in (64, 128):
        raise ValueError(
            "block_mask.BLOCK_SIZE: BSA needs equal Q and KV block sizes of 64 or 128, got "
            "(%d, %d); create the BlockMask with BLOCK_SIZE=64 or 128" % (bs_q, bs_kv)
        )
    part_num, part_idx = block_mask.kv_num_blocks, block_mask.kv_indices
    num, idx = part_num, part_idx
    if idx.dim() != 4:
        raise ValueError(
            "block_mask.kv_indices: expected [B, H, N_q, K], got shape %s (an indexed "
            "BlockMask? use the full one)" % (tuple(idx.shape),)
        )
    if block_mask.full_kv_num_blocks is not None:
        full_num, full_idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
        idx = torch.cat([idx, full_idx], dim=-1)
        k1, k2 = block_mask.kv_indices.shape[-1], full_idx.shape[-1]
        slots1 = torch.arange(k1, device=idx.device)
        slots2 = torch.arange(k2, device=idx.device)
        valid = torch.cat([slots1 < num.unsqueeze(-1), slots2 < full_num.unsqueeze(-1)], dim=-1)
        idx = _compact(idx, valid)
        num = num + full_num
    seq_lengths = getattr(block_mask, "seq_lengths", None)  # torch >= 2.6
    if seq_lengths is not None:
        q_len, kv_len = (int(n) for n in seq_lengths)
        n_q = (q_len + bs_q - 1) // bs_q
        n_kv = (kv_len + bs_kv - 1) // bs_kv
        idx = idx[:, :, :n_q, : min(idx.shape[-1], n_kv)]
    else:
        n_q = idx.shape[2]
        n_kv = block_mask.kv_indices.shape[-1]
        q_len, kv_len = n_q * bs_q, n_kv * bs_kv
    if mask != "none":
        _check_flex_against_mask(block_mask, part_num, part_idx, mask, n_q, n_kv, bs_q, q_len,
                                 kv_len, causal_offset, window_left, window_right)
    return idx.to(torch.int32).contiguous(), num[:, :, :n_q].to(torch.int32).contiguous()


def _listed(num, idx, n_q, n_kv):
    """[B, H, N_q, N_kv] bool: the blocks of a BlockMask's (num, idx) pair."""
    idx = idx[:, :, :n_q].long()
    valid = torch.arange(idx.shape[-1], device=idx.device) < num[:, :, :n_q, None]
    out = torch.zeros(idx.shape[:3] + (n_kv + 1,), dtype=torch.bool, device=idx.device)
    out.scatter_(-1, torch.where(valid & (idx < n_kv), idx, n_kv), True)
    return out[..., :n_kv]


def _check_flex_against_mask(block_mask, part_num, part_idx, mask, n_q, n_kv, block, s_q, s_kv,
                             causal_offset, window_left, window_right):
    partial = _listed(part_num, part_idx, n_q, n_kv)
    if mask is None:
        if bool(partial.any()):
            b, h, m, n = (int(x) for x in partial.nonzero()[0])
            raise ValueError(
                "block_mask: partial block (b=%d, h=%d, q block %d, kv block %d) and no mask: "
                "FlexAttention applies the BlockMask's mask_mod inside partial blocks, which BSA "
                "cannot run, so BSA would attend the whole block (a superset of FlexAttention's "
                "pairs). Pass the token mask that equals the mask_mod (mask='causal', 'window' or "
                "'causal_window', with causal_offset / window_left / window_right; "
                "FlexAttention's q_idx >= kv_idx is mask='causal', causal_offset=0) here and to "
                "block_sparse_attention, or mask='none' to accept the superset"
                % (b, h, m, n))
        return
    lo, hi = _mask_band(mask, causal_offset, window_left, window_right, s_q, s_kv)
    cls = _block_classes(n_q, n_kv, block, s_q, s_kv, lo, hi, partial.device)
    at_end = torch.zeros(n_q, n_kv, dtype=torch.bool, device=partial.device)
    if s_q % block:
        at_end[-1, :] = True
    if s_kv % block:
        at_end[:, -1] = True
    what = "mask=%r (causal_offset=%r, window_left=%r, window_right=%r)" % (
        mask, causal_offset, window_left, window_right)
    problems = [(partial & (cls == 2), "a partial block that %s hides entirely"),
                (partial & (cls == 0) & ~at_end,
                 "a partial block that %s shows entirely (its mask_mod hides pairs the mask "
                 "cannot express)")]
    if block_mask.full_kv_num_blocks is not None:
        full = _listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_q, n_kv)
        problems.append((full & (cls != 0), "a full block that %s does not show entirely"))
    for bad, text in problems:
        if bool(bad.any()):
            b, h, m, n = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                "block_mask: (b=%d, h=%d, q block %d, kv block %d) is %s: the BlockMask's "
                "mask_mod and the mask disagree (FlexAttention's q_idx >= kv_idx is "
                "mask='causal' with causal_offset=0)" % (b, h, m, n, text % what))


def bsa_causal_block_metadata(
    s_q: int,
    s_kv: Optional[int] = None,
    *,
    block_size: int = 128,
    topk_blocks: Optional[Tensor] = None,
    window_blocks: int = 0,
    sink_blocks: int = 0,
    causal_offset: Optional[int] = None,
    device=None,
) -> Tuple[Tensor, Tensor]:
    """``(q2k_index, q2k_count)`` of the common causal block patterns, for
    ``block_sparse_attention(..., block_size=block_size, mask="causal",
    causal_offset=causal_offset)``.

    Query block ``m`` lists, in increasing order and each once:

    - its diagonal block(s): the KV blocks that hold the causal boundary ``i + c`` of its rows
      (``c = causal_offset``, default ``S_kv - S_q``), cut by the token mask;
    - ``window_blocks`` blocks just before them (a sliding window of whole blocks);
    - the first ``sink_blocks`` blocks of the sequence (attention sinks);
    - the blocks of ``topk_blocks[b, h, m, :]`` (a MoBA- or NSA-style selection, e.g. a gate's
      top-k; entries outside ``[0, N_kv)``, such as -1, are ignored).

    Blocks after the diagonal are left out (the mask would hide them). ``topk_blocks`` is an
    integer tensor ``[B, H, N_q, k]`` (B and H may be 1 to broadcast); without it the result is
    ``[1, 1, N_q, N_kv]``. ``s_kv`` defaults to ``s_q``. Runs on ``topk_blocks``' device (or
    ``device``) with tensor operations only, no host synchronisation.
    """
    for name, value in (("s_q", s_q), ("block_size", block_size),
                        ("window_blocks", window_blocks), ("sink_blocks", sink_blocks)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    s_kv = s_q if s_kv is None else s_kv
    if isinstance(s_kv, bool) or not isinstance(s_kv, int):
        raise TypeError("s_kv: expected an int or None, got %s" % type(s_kv).__name__)
    if causal_offset is not None and (isinstance(causal_offset, bool)
                                      or not isinstance(causal_offset, int)):
        raise TypeError("causal_offset: expected an int or None, got %s"
                        % type(causal_offset).__name__)
    if block_size not in (64, 128):
        raise ValueError("block_size: expected 64 or 128, got %d" % block_size)
    if s_q < 1 or s_kv < 1:
        raise ValueError("s_q, s_kv: expected >= 1, got %d, %d" % (s_q, s_kv))
    if window_blocks < 0 or sink_blocks < 0:
        raise ValueError("window_blocks, sink_blocks: expected >= 0, got %d, %d"
                         % (window_blocks, sink_blocks))
    if topk_blocks is not None:
        if not isinstance(topk_blocks, torch.Tensor) or topk_blocks.dim() != 4 or (
                topk_blocks.dtype.is_floating_point or topk_blocks.dtype == torch.bool):
            raise ValueError("topk_blocks: expected an integer tensor [B, H, N_q, k]")
        device = topk_blocks.device
    n_q = -(-s_q // block_size)
    n_kv = -(-s_kv // block_size)
    if topk_blocks is not None and topk_blocks.shape[2] != n_q:
        raise ValueError("topk_blocks: expected N_q = ceil(s_q / block_size) = %d query blocks, "
                         "got shape %s" % (n_q, tuple(topk_blocks.shape)))
    c = s_kv - s_q if causal_offset is None else causal_offset
    m = torch.arange(n_q, device=device, dtype=torch.int64)[:, None]
    n = torch.arange(n_kv, device=device, dtype=torch.int64)[None, :]
    first_row = m * block_size
    last_row = torch.clamp((m + 1) * block_size, max=s_q) - 1
    # Keys past the last row's boundary are hidden from every row of the block.
    last_key = last_row + c                       # may be < 0 (nothing visible) or >= s_kv
    first_diag = torch.div(first_row + c, block_size, rounding_mode="floor")
    visible = n * block_size <= last_key          # blocks with a key some row sees
    diagonal = visible & (n >= first_diag)
    window = visible & (n >= first_diag - window_blocks)
    sinks = visible & (n < sink_blocks)
    dense = (diagonal | window | sinks)[None, None]
    if topk_blocks is not None:
        chosen = _listed(torch.full(topk_blocks.shape[:3], topk_blocks.shape[3],
                                    device=device, dtype=torch.int64),
                         torch.where(topk_blocks < 0, n_kv, topk_blocks.long()), n_q, n_kv)
        dense = dense | (chosen & visible[None, None])
    return bsa_metadata_from_block_mask(dense)
