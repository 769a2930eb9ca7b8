"""Metadata helpers against brute force, and FlexAttention equivalence for block-granular masks."""

import pytest
import torch

from conftest import bsa_dense, bsa_token_mask
from sparse_attention import (
    block_sparse_attention,
    bsa_metadata_from_block_mask,
    bsa_metadata_from_flex_block_mask,
)

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    HAVE_FLEX = True
except ImportError:  # torch without FlexAttention
    HAVE_FLEX = False
needs_flex = pytest.mark.skipif(not HAVE_FLEX, reason="torch.nn.attention.flex_attention missing")


def brute_force_rows(mask):
    """{(b, h, m): [n, ...]} in increasing order, from a [B, H, N_q, N_kv] bool mask."""
    b, h, n_q, n_kv = mask.shape
    return {
        (bb, hh, m): [n for n in range(n_kv) if mask[bb, hh, m, n]]
        for bb in range(b) for hh in range(h) for m in range(n_q)
    }


def rows_of(index, count):
    b, h, n_q, _ = index.shape
    return {
        (bb, hh, m): index[bb, hh, m, : count[bb, hh, m]].tolist()
        for bb in range(b) for hh in range(h) for m in range(n_q)
    }


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("density", [0.0, 0.3, 0.7, 1.0])
def test_block_mask_helper_matches_brute_force(seed, density):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(2, 3, 5, 7, generator=g) < density
    index, count = bsa_metadata_from_block_mask(mask)
    assert index.dtype == torch.int32 and count.dtype == torch.int32
    assert index.shape == (2, 3, 5, 7) and count.shape == (2, 3, 5)
    assert index.is_contiguous()
    assert rows_of(index, count) == brute_force_rows(mask)
    assert int(index.min()) >= 0 and int(index.max()) < 7  # padding stays in range too


def test_block_mask_helper_k_max():
    mask = torch.zeros(1, 1, 3, 8, dtype=torch.bool)
    mask[0, 0, 0, [1, 5]] = True
    mask[0, 0, 2, [7]] = True
    index, count = bsa_metadata_from_block_mask(mask, k_max=2)
    assert index.shape == (1, 1, 3, 2)
    assert rows_of(index, count) == brute_force_rows(mask)
    with pytest.raises(ValueError, match="k_max = 1"):
        bsa_metadata_from_block_mask(mask, k_max=1)
    with pytest.raises(ValueError, match=r"\[B, H, N_q, N_kv\]"):
        bsa_metadata_from_block_mask(mask[0])


def test_block_mask_helper_accepts_integer_masks():
    mask = (torch.rand(1, 2, 3, 4, generator=torch.Generator().manual_seed(0)) < 0.5)
    a = bsa_metadata_from_block_mask(mask)
    b = bsa_metadata_from_block_mask(mask.to(torch.uint8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def _flex_block_mask(mask_mod, b, h, s_q, s_kv, block):
    return create_block_mask(mask_mod, b, h, s_q, s_kv, device="cpu", BLOCK_SIZE=block)


@needs_flex
@pytest.mark.parametrize("block", [64, 128])
def test_flex_helper_matches_brute_force(block):
    # A token-level mask with partial blocks (a per-head window no token mask expresses),
    # taken as the block superset explicitly (mask="none"): the union of partial and full
    # blocks, i.e. every block with at least one attended pair.
    s_q, s_kv = 3 * block + 5, 4 * block

    def sliding_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < block + 17 * (h + 1))

    bm = _flex_block_mask(sliding_causal, 2, 2, s_q, s_kv, block)
    with pytest.raises(ValueError, match="partial block"):
        bsa_metadata_from_flex_block_mask(bm)  # no mask: refused, not the superset
    index, count = bsa_metadata_from_flex_block_mask(bm, "none")
    n_q, n_kv = -(-s_q // block), -(-s_kv // block)
    assert index.dtype == torch.int32 and count.shape == (2, 2, n_q) and index.shape[:3] == (2, 2, n_q)
    qi = torch.arange(s_q)[:, None]
    ki = torch.arange(s_kv)[None, :]
    expect = torch.zeros(2, 2, n_q, n_kv, dtype=torch.bool)
    for hh in range(2):
        tok = sliding_causal(0, hh, qi, ki)
        padded = torch.zeros(n_q * block, n_kv * block, dtype=torch.bool)
        padded[:s_q, :s_kv] = tok
        expect[:, hh] = padded.view(n_q, block, n_kv, block).any(dim=3).any(dim=1)
    got = {k: sorted(v) for k, v in rows_of(index, count).items()}
    assert got == brute_force_rows(expect)


@pytest.mark.parametrize("block_size", [(128, 64), (32, 32)])
def test_flex_helper_rejects_block_sizes_bsa_lacks(block_size):
    # Only BLOCK_SIZE is read before the check: a stand-in keeps this independent of torch.
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"BLOCK_SIZE: BSA needs equal Q and KV block sizes of 64 or 128"):
        bsa_metadata_from_flex_block_mask(SimpleNamespace(BLOCK_SIZE=block_size))


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_switch_from_flex_attention_block_granular_mask():
    # A block-granular mask (block-causal over 64-token blocks, plus a per-head dilation):
    # FlexAttention and BSA must agree exactly, including the broadcast B=None/H=None BlockMask.
    block, s = 64, 256

    def block_causal(b, h, q_idx, kv_idx):
        return (kv_idx // block) <= (q_idx // block)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, s, 16, generator=g, dtype=torch.float32) for _ in range(3))
    for bm in (_flex_block_mask(block_causal, None, None, s, s, block),
               _flex_block_mask(block_causal, 2, 2, s, s, block)):
        o_flex = flex_attention(q, k, v, block_mask=bm)
        index, count = bsa_metadata_from_flex_block_mask(bm)
        o, lse = block_sparse_attention(q, k, v, index, count, block_size=block)
        torch.testing.assert_close(o, o_flex, atol=2e-5, rtol=2e-5)
        tok = bsa_token_mask(index.expand(2, 2, -1, -1), count.expand(2, 2, -1), None, block, s, s)
        torch.testing.assert_close(lse, bsa_dense(q.double(), k.double(), v.double(), tok)[1].float(),
                                   atol=1e-5, rtol=1e-5)


@needs_flex
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_flex_block_size_64_with_the_default_block_size_names_the_likely_cause(layout):
    # A BlockMask made with BLOCK_SIZE=64, then block_sparse_attention with the default block
    # size 128: the q2k_index shape error says which block size the metadata was made for.
    s = 256

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    index, count = bsa_metadata_from_flex_block_mask(_flex_block_mask(causal, None, None, s, s, 64),
                                                     "causal")
    q = torch.randn(1, 2, s, 8, dtype=torch.float64)
    if layout == "bshd":
        q = q.transpose(1, 2).contiguous()
    with pytest.raises(ValueError, match=r"sparsity\.q2k_index: expected shape .*got \[1, 2, 4, 4\]"
                       r"; N_q = 4 = ceil\(S_q / 64\): metadata for 64-token blocks \(a "
                       r"FlexAttention BlockMask created with BLOCK_SIZE=64\?\) needs "
                       r"block_size=64"):
        block_sparse_attention(q, q, q, index, count, layout=layout)
    block_sparse_attention(q, q, q, index, count, layout=layout, block_size=64)  # and it runs


def test_block_size_hint_both_ways_and_only_when_it_fits():
    s = 256
    q = torch.randn(1, 2, s, 8, dtype=torch.float64)
    n = lambda block: -(-s // block)  # noqa: E731
    index, count = bsa_metadata_from_block_mask(torch.ones(1, 2, n(128), n(128), dtype=torch.bool))
    with pytest.raises(ValueError, match=r"; N_q = 2 = ceil\(S_q / 128\): metadata for 128-token "
                       r"blocks .*needs block_size=128 \[src/"):
        block_sparse_attention(q, q, q, index, count, block_size=64)
    index, count = bsa_metadata_from_block_mask(torch.ones(1, 2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"sparsity\.q2k_index: expected shape") as err:
        block_sparse_attention(q, q, q, index, count)  # N_q = 3 fits neither block size: no hint
    assert "N_q = 3" not in str(err.value) and "BLOCK_SIZE" not in str(err.value)
