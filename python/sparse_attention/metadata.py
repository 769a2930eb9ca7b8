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


def bsa_metadata_from_flex_block_mask(block_mask) -> Tuple[Tensor, Tensor]:
    """``(q2k_index, q2k_count)`` from a FlexAttention ``BlockMask``
    (``torch.nn.attention.flex_attention.create_block_mask``).

    The KV blocks of a query block are the union of the BlockMask's partial blocks
    (``kv_num_blocks``/``kv_indices``) and full blocks (``full_kv_num_blocks``/
    ``full_kv_indices``). BSA attends whole blocks: the BlockMask's ``mask_mod`` is **not**
    applied inside partial blocks, so the result equals FlexAttention exactly only for
    block-granular masks (every block of the mask entirely in or out; the sequence ends, which
    the library cuts at ``S_q`` and ``S_kv``, excepted). The BlockMask's Q and KV block sizes
    must be equal (64 or 128): pass that as ``block_size``. Batch or head dimensions of size 1
    broadcast in ``block_sparse_attention``.
    """
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
    num, idx = block_mask.kv_num_blocks, block_mask.kv_indices
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
    return idx.to(torch.int32).contiguous(), num[:, :, :n_q].to(torch.int32).contiguous()
