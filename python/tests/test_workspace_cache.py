"""The workspace-size cache of the ctypes layer (sparse_attention._abi): a repeated call shape
asks the library for its workspace size once (and validates its shapes before allocating the
outputs once: two queries per new call shape); another shape, another option or another optional
tensor asks again; data pointers and values never change the key."""

import torch

from conftest import random_bsa_meta
from sparse_attention import _abi, bsa_metadata_from_block_mask, block_sparse_attention


class _Spy:
    """Counts the calls of one ctypes function of the library (and forwards them)."""

    def __init__(self, op):
        self.name = "sa_%s_workspace_size" % op
        self.fn = getattr(_abi.LIB, self.name)
        self.calls = 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)

    def __enter__(self):
        setattr(_abi.LIB, self.name, self)
        return self

    def __exit__(self, *exc):
        setattr(_abi.LIB, self.name, self.fn)


def _problem(s, seed, scale=None):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, s, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = random_bsa_meta(1, 2, s // 64, s // 64, 0.6, torch.Generator().manual_seed(seed))
    idx, cnt = bsa_metadata_from_block_mask(mask)
    return q, k, v, idx, cnt


def test_repeated_call_shape_queries_once():
    _abi._WS_CACHE.clear()
    _abi._SHAPES_OK.clear()
    with _Spy("bsa_forward") as spy:
        q, k, v, idx, cnt = _problem(128, 0)
        o1, _ = block_sparse_attention(q, k, v, idx, cnt, block_size=64)
        assert spy.calls == 2  # the shape check before allocation, the workspace size
        # New tensors (other pointers, other values), same shapes: no new query.
        q2, k2, v2, idx2, cnt2 = _problem(128, 1)
        o2, _ = block_sparse_attention(q2, k2, v2, idx2, cnt2, block_size=64)
        assert spy.calls == 2
        # Another shape, then another option: two queries each.
        q3, k3, v3, idx3, cnt3 = _problem(192, 2)
        block_sparse_attention(q3, k3, v3, idx3, cnt3, block_size=64)
        assert spy.calls == 4
        block_sparse_attention(q, k, v, idx, cnt, block_size=64, scale=0.5)
        assert spy.calls == 6
    assert not torch.equal(o1, o2)


def test_key_ignores_pointers_but_not_presence():
    args_a = _abi.sa_bsa_fwd_args()
    args_b = _abi.sa_bsa_fwd_args()
    args_a.q.data, args_b.q.data = 0x1000, 0x2000
    assert _abi._call_shape_key("bsa_forward", args_a) == _abi._call_shape_key(
        "bsa_forward", args_b)
    args_b.sparsity.kv_block_len.data = 0x3000  # an optional tensor now present
    assert _abi._call_shape_key("bsa_forward", args_a) != _abi._call_shape_key(
        "bsa_forward", args_b)
    args_b.sparsity.kv_block_len.data = 0
    args_b.options.deterministic = 1
    assert _abi._call_shape_key("bsa_forward", args_a) != _abi._call_shape_key(
        "bsa_forward", args_b)
