"""BSA token masks (SPEC 4) through the package on the CPU: values and gradients against a dense
masked PyTorch reference (fp64), the argument errors, the FlexAttention import with a mask, and
the causal block-pattern helper."""

import pytest
import torch

from conftest import bsa_dense, bsa_token_mask
from sparse_attention import (
    block_sparse_attention,
    bsa_causal_block_metadata,
    bsa_metadata_from_block_mask,
    bsa_metadata_from_flex_block_mask,
)

try:
    from torch.nn.attention.flex_attention import create_block_mask

    HAVE_FLEX = True
except ImportError:  # torch without FlexAttention
    HAVE_FLEX = False
needs_flex = pytest.mark.skipif(not HAVE_FLEX, reason="torch.nn.attention.flex_attention missing")


def spec_mask(kind, s_q, s_kv, offset=None, left=0, right=0):
    """[S_q, S_kv] bool straight from SPEC 4 (independent of the package's code)."""
    c = s_kv - s_q if offset is None else offset
    i = torch.arange(s_q)[:, None]
    s = torch.arange(s_kv)[None, :]
    ok = torch.ones(s_q, s_kv, dtype=torch.bool)
    if kind in ("causal", "causal_window"):
        ok &= s <= i + c
    if kind in ("window", "causal_window"):
        ok &= s >= i + c - left
    if kind == "window":
        ok &= s <= i + c + right
    return ok


def run_case(b, h_q, h_kv, s_q, s_kv, d, block, layout, kind, offset=None, left=None, right=None,
             density=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_q, n_kv = -(-s_q // block), -(-s_kv // block)
    blocks = torch.rand(b, h_q, n_q, n_kv, generator=g) < density
    index, count = bsa_metadata_from_block_mask(blocks)

    def make(h, s):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    q, k, v = make(h_q, s_q), make(h_kv, s_kv), make(h_kv, s_kv)
    kwargs = {}
    if kind is not None:
        kwargs["mask"] = kind
    if offset is not None:
        kwargs["causal_offset"] = offset
    if left is not None:
        kwargs["window_left"] = left
    if right is not None:
        kwargs["window_right"] = right
    o, lse = block_sparse_attention(q, k, v, index, count, block_size=block, layout=layout,
                                    **kwargs)
    tok = bsa_token_mask(index, count, None, block, s_q, s_kv)
    if kind not in (None, "none"):
        tok = tok & spec_mask(kind, s_q, s_kv, offset, left or 0, right or 0)
    o_ref, lse_ref = bsa_dense(q, k, v, tok, layout=layout)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-5, rtol=1e-5)
    dout = torch.randn(o.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(o, (q, k, v), dout)
    want = torch.autograd.grad(o_ref, (q, k, v), dout)
    for name, x, y in zip("qkv", got, want):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5, msg="d" + name)
    return tok


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize(
    "case",
    [
        dict(s_q=150, s_kv=150, kind="causal"),
        dict(s_q=70, s_kv=200, kind="causal"),                       # bottom-right default
        dict(s_q=200, s_kv=90, kind="causal"),                       # rows with no key
        dict(s_q=130, s_kv=130, kind="causal", offset=-40),
        dict(s_q=128, s_kv=128, kind="window", left=0, right=0),     # window 0
        dict(s_q=140, s_kv=180, kind="window", left=33, right=7),
        dict(s_q=160, s_kv=160, kind="causal_window", left=50),
        dict(s_q=100, s_kv=100, kind="none"),
    ],
    ids=lambda c: "-".join("%s=%s" % kv for kv in c.items()),
)
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_masked_bsa_matches_dense_reference(layout, case, heads):
    run_case(1, heads[0], heads[1], case["s_q"], case["s_kv"], 8, 64, layout, case["kind"],
             case.get("offset"), case.get("left"), case.get("right"))


def test_masked_bsa_block_128_and_empty_rows():
    tok = run_case(2, 2, 1, 300, 300, 8, 128, "bhsd", "causal", offset=-150, density=1.0)
    assert not tok[..., :150, :].any()  # the first 150 rows see no key


def test_mask_argument_errors():
    q = torch.randn(1, 1, 64, 8, dtype=torch.float64)
    idx = torch.zeros(1, 1, 1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="mask: expected None, 'none', 'causal'"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="diagonal")
    with pytest.raises(TypeError, match="mask: expected a str or None"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask=1)
    with pytest.raises(ValueError, match="window_left: required by mask='window'"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="window")
    with pytest.raises(ValueError, match="causal_offset: given without a mask"):
        block_sparse_attention(q, q, q, idx, block_size=64, causal_offset=3)
    # The library's own named errors come through.
    with pytest.raises(ValueError, match="options.window_left: 4 is set but options.mask = "
                                         "SA_MASK_CAUSAL has no window"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="causal", window_left=4)
    with pytest.raises(ValueError, match="options.window_right: 2 is set but options.mask = "
                                         "SA_MASK_CAUSAL_WINDOW already hides"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="causal_window", window_left=4,
                               window_right=2)
    with pytest.raises(ValueError, match=r"options.window_left, options.window_right: expected "
                                         r">= 0, got -1, 0"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="window", window_left=-1)


def test_mask_under_meta_tensors_validates_before_running():
    q = torch.randn(1, 1, 64, 8, dtype=torch.float64, device="meta")
    idx = torch.zeros(1, 1, 1, 1, dtype=torch.int32, device="meta")
    o, lse = block_sparse_attention(q, q, q, idx, block_size=64, mask="causal")
    assert o.shape == q.shape and lse.shape == (1, 1, 64)
    with pytest.raises(ValueError, match="options.window_left"):
        block_sparse_attention(q, q, q, idx, block_size=64, mask="causal", window_left=1)


# ---- FlexAttention import ------------------------------------------------------------------------
def _flex(mask_mod, b, h, s_q, s_kv, block):
    return create_block_mask(mask_mod, b, h, s_q, s_kv, device="cpu", BLOCK_SIZE=block)


@needs_flex
@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("s", [256, 300])
def test_flex_causal_with_mask_matches_dense_causal(block, s):
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    bm = _flex(causal, None, None, s, s, block)
    with pytest.raises(ValueError, match="partial block .* and no mask: FlexAttention applies "
                                         "the BlockMask's mask_mod inside partial blocks"):
        bsa_metadata_from_flex_block_mask(bm)
    index, count = bsa_metadata_from_flex_block_mask(bm, "causal")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, s, 16, generator=g, dtype=torch.float64) for _ in range(3))
    o, lse = block_sparse_attention(q, k, v, index, count, block_size=block, mask="causal")
    o_ref, lse_ref = bsa_dense(q, k, v, spec_mask("causal", s, s).expand(1, 2, s, s))
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    # mask="none" takes the block superset explicitly.
    sup_index, sup_count = bsa_metadata_from_flex_block_mask(bm, "none")
    assert torch.equal(sup_index, index) and torch.equal(sup_count, count)


@needs_flex
def test_flex_sliding_window_with_sinks_is_expressed_and_mismatches_are_refused():
    block, s, w = 64, 320, 100

    def sliding(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx <= w)

    bm = _flex(sliding, None, None, s, s, block)
    index, count = bsa_metadata_from_flex_block_mask(bm, "causal_window", window_left=w)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, s, 8, generator=g, dtype=torch.float64) for _ in range(3))
    o, _ = block_sparse_attention(q, k, v, index, count, block_size=block, mask="causal_window",
                                  window_left=w)
    o_ref, _ = bsa_dense(q, k, v, spec_mask("causal_window", s, s, left=w).expand(1, 1, s, s))
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    # A mask that disagrees with the mask_mod: plain causal shows whole blocks the window cuts.
    with pytest.raises(ValueError, match="the BlockMask's mask_mod and the mask disagree"):
        bsa_metadata_from_flex_block_mask(bm, "causal")
    # A mask_mod the mask cannot express (causal within documents): refused, not computed.
    def documents(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx // 100) == (kv_idx // 100))

    with pytest.raises(ValueError, match="partial block that .* shows entirely"):
        bsa_metadata_from_flex_block_mask(_flex(documents, None, None, s, s, block), "causal")


@needs_flex
def test_flex_block_granular_mask_needs_no_mask():
    block, s = 64, 256

    def block_causal(b, h, q_idx, kv_idx):
        return (kv_idx // block) <= (q_idx // block)

    index, count = bsa_metadata_from_flex_block_mask(_flex(block_causal, None, None, s, s, block))
    assert int(count.sum()) == 1 + 2 + 3 + 4


# ---- the causal block-pattern helper -------------------------------------------------------------
def _rows(index, count):
    return [[index[b, h, m, : count[b, h, m]].tolist() for m in range(index.shape[2])]
            for b in range(index.shape[0]) for h in range(index.shape[1])]


def test_causal_helper_diagonal_window_sinks():
    index, count = bsa_causal_block_metadata(6 * 64, block_size=64, window_blocks=1,
                                             sink_blocks=1)
    assert _rows(index, count) == [[[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 4, 5]]]
    # S_q < S_kv: the default offset puts the diagonal at the end of the keys.
    index, count = bsa_causal_block_metadata(128, 320, block_size=64)
    assert _rows(index, count) == [[[3], [4]]]
    # An offset that is not a multiple of the block: two diagonal blocks.
    index, count = bsa_causal_block_metadata(128, 128, block_size=64, causal_offset=-32)
    assert _rows(index, count) == [[[0], [0, 1]]]
    # Rows that see nothing: an empty list.
    index, count = bsa_causal_block_metadata(128, 128, block_size=64, causal_offset=-100)
    assert _rows(index, count) == [[[], [0]]]


def test_causal_helper_topk_and_attention():
    s, block = 512, 64
    n = s // block
    g = torch.Generator().manual_seed(3)
    # A MoBA-like gate: 2 random blocks per query block (some after the diagonal, some -1).
    topk = torch.randint(-1, n, (1, 2, n, 2), generator=g)
    index, count = bsa_causal_block_metadata(s, block_size=block, topk_blocks=topk, sink_blocks=1)
    for h in range(2):
        for m in range(n):
            want = {m, 0} | {int(x) for x in topk[0, h, m] if 0 <= x <= m}
            assert index[0, h, m, : count[0, h, m]].tolist() == sorted(want)
    q, k, v = (torch.randn(1, 2, s, 8, generator=g, dtype=torch.float64) for _ in range(3))
    o, _ = block_sparse_attention(q, k, v, index, count, block_size=block, mask="causal")
    tok = bsa_token_mask(index, count, None, block, s, s) & spec_mask("causal", s, s)
    o_ref, _ = bsa_dense(q, k, v, tok)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)


def test_causal_helper_argument_errors():
    with pytest.raises(ValueError, match="block_size: expected 64 or 128"):
        bsa_causal_block_metadata(100, block_size=32)
    with pytest.raises(ValueError, match="window_blocks, sink_blocks: expected >= 0"):
        bsa_causal_block_metadata(100, window_blocks=-1)
    with pytest.raises(ValueError, match="topk_blocks: expected N_q"):
        bsa_causal_block_metadata(300, block_size=128, topk_blocks=torch.zeros(1, 1, 2, 1,
                                                                               dtype=torch.long))
    with pytest.raises(TypeError, match="s_q: expected an int"):
        bsa_causal_block_metadata(1.5)
