"""BSA through the package on CPU (the library's fp64 reference): values against a dense torch
oracle, gradients against torch autograd of that oracle and torch.autograd.gradcheck."""

import pytest
import torch

from conftest import bsa_dense, bsa_token_mask, random_bsa_meta
from sparse_attention import bsa_metadata_from_block_mask, block_sparse_attention

F64 = torch.float64


def make_qkv(b, hq, hkv, s_q, s_kv, d, dv, layout="bhsd", dtype=F64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)

    def t(h, s, dd):
        shape = (b, h, s, dd) if layout == "bhsd" else (b, s, h, dd)
        return torch.randn(shape, generator=g, dtype=dtype).requires_grad_(requires_grad)

    return t(hq, s_q, d), t(hkv, s_kv, d), t(hkv, s_kv, dv)


CASES = [
    # name, B, H_q, H_kv, S_q, S_kv, D, D_v, block, layout
    ("mha_bhsd", 1, 2, 2, 128, 128, 8, 8, 64, "bhsd"),
    ("gqa_bshd", 2, 4, 2, 128, 192, 8, 4, 64, "bshd"),
    ("mqa_ragged", 1, 3, 1, 100, 150, 8, 8, 64, "bhsd"),
    ("block128", 1, 2, 1, 256, 256, 4, 4, 128, "bhsd"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_dense_oracle(case):
    _, b, hq, hkv, s_q, s_kv, d, dv, block, layout = case
    n_q, n_kv = -(-s_q // block), -(-s_kv // block)
    mask = random_bsa_meta(b, hq, n_q, n_kv, 0.6, torch.Generator().manual_seed(1))
    idx, cnt = bsa_metadata_from_block_mask(mask)
    q, k, v = make_qkv(b, hq, hkv, s_q, s_kv, d, dv, layout)
    o, lse = block_sparse_attention(q, k, v, idx, cnt, block_size=block, layout=layout)
    tok = bsa_token_mask(idx, cnt, None, block, s_q, s_kv)
    o_ref, lse_ref = bsa_dense(q, k, v, tok, layout=layout)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-5, rtol=1e-6)

    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v), do)
    for g, g_ref, name in zip(grads, grads_ref, "qkv"):
        # P is recomputed from the fp32 LSE: about 1e-7 relative.
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5, msg=lambda m: "d%s: %s" % (name, m))


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradcheck(layout):
    # SPEC sizes scaled down: D = 8, S = 128, block 64, GQA, one empty row, fp64.
    b, hq, hkv, s, d, block = 1, 2, 1, 128, 8, 64
    q, k, v = make_qkv(b, hq, hkv, s, s, d, d, layout, seed=3)
    mask = torch.tensor([[[[True, False], [True, True]], [[False, False], [False, True]]]])
    idx, cnt = bsa_metadata_from_block_mask(mask)

    def fn(q, k, v):
        return block_sparse_attention(q, k, v, idx, cnt, block_size=block, layout=layout)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_gradcheck_fixed_count_and_partial_kv_blocks():
    q, k, v = make_qkv(1, 2, 2, 128, 128, 8, 8, seed=4)
    idx = torch.tensor([[[[1, 0], [0, 1]], [[0, 1], [1, 0]]]], dtype=torch.int32)
    kv_block_len = torch.tensor([40, 17], dtype=torch.int32)

    def fn(q, k, v):
        return block_sparse_attention(q, k, v, idx, count=1, kv_block_len=kv_block_len,
                                      block_size=64)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)
    o = fn(q, k, v)
    tok = bsa_token_mask(idx, None, 1, 64, 128, 128, kv_block_len)
    torch.testing.assert_close(o, bsa_dense(q, k, v, tok)[0], atol=1e-10, rtol=1e-10)


def test_empty_rows_and_unattended_kv_blocks():
    q, k, v = make_qkv(1, 1, 1, 128, 192, 8, 8)
    mask = torch.tensor([[[[False, False, False], [True, False, True]]]])
    idx, cnt = bsa_metadata_from_block_mask(mask)
    o, lse = block_sparse_attention(q, k, v, idx, cnt, block_size=64)
    assert torch.all(o[:, :, :64] == 0)
    assert torch.all(lse[:, :, :64] == float("-inf"))
    assert torch.isfinite(lse[:, :, 64:]).all()
    o.sum().backward()
    assert torch.all(k.grad[:, :, 64:128] == 0) and torch.all(v.grad[:, :, 64:128] == 0)
    assert torch.all(q.grad[:, :, :64] == 0)


def test_low_precision_inputs_on_cpu():
    # The reference takes bf16/fp16/fp32 too; outputs keep the input dtype, LSE is fp32.
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q, k, v = make_qkv(1, 2, 2, 128, 128, 64, 64, dtype=dtype, requires_grad=True)
        idx = torch.tensor([0, 1], dtype=torch.int32).expand(1, 2, 2, 2)
        o, lse = block_sparse_attention(q, k, v, idx, block_size=64)
        assert o.dtype == dtype and lse.dtype == torch.float32
        tok = bsa_token_mask(idx, None, None, 64, 128, 128)
        o_ref, _ = bsa_dense(q.double(), k.double(), v.double(), tok)
        err = (o.double() - o_ref).norm() / o_ref.norm()
        assert err < 1e-2, "%s: relative L2 error %.3g" % (dtype, err)
        o.float().square().sum().backward()
        assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()


def test_metadata_broadcast_and_int64_indices():
    q, k, v = make_qkv(2, 2, 2, 128, 128, 8, 8, requires_grad=False)
    mask = torch.tensor([[[[True, False], [True, True]]]])  # [1, 1, N_q, N_kv]
    idx, cnt = bsa_metadata_from_block_mask(mask)
    o, _ = block_sparse_attention(q, k, v, idx.long(), cnt.long(), block_size=64)
    o_full, _ = block_sparse_attention(q, k, v, idx.expand(2, 2, 2, 2).contiguous(),
                                       cnt.expand(2, 2, 2).contiguous(), block_size=64)
    torch.testing.assert_close(o, o_full, atol=0, rtol=0)


def test_lse_has_no_gradient_and_strided_inputs():
    q, k, v = make_qkv(1, 2, 2, 128, 128, 8, 8)
    idx = torch.tensor([1, 0], dtype=torch.int32).expand(1, 2, 2, 2)
    # A non-contiguous last dimension is made contiguous by the wrapper.
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    o, lse = block_sparse_attention(qt, k, v, idx, block_size=64, scale=0.5)
    assert not lse.requires_grad and o.requires_grad
    tok = bsa_token_mask(idx, None, None, 64, 128, 128)
    torch.testing.assert_close(o, bsa_dense(q, k, v, tok, scale=0.5)[0], atol=1e-10, rtol=1e-10)
    (o.sum() + lse.sum()).backward()  # lse's part is ignored, not an error
    assert q.grad is not None


def test_deterministic_and_bucket_options_are_accepted():
    q, k, v = make_qkv(1, 2, 2, 128, 128, 8, 8)
    idx = torch.tensor([1, 0], dtype=torch.int32).expand(1, 2, 2, 2)
    grads = []
    for _ in range(2):
        o, _ = block_sparse_attention(q, k, v, idx, block_size=64, deterministic=True,
                                      bucket_size=1, validate=True)
        grads.append(torch.autograd.grad(o.sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
