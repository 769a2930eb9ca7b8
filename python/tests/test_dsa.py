"""DSA through the package on CPU (the library's fp64 reference): values against a dense torch
oracle, gradients (q, kv, sink) against torch autograd of that oracle and gradcheck."""

import pytest
import torch

from conftest import dsa_dense
from sparse_attention import deepseek_sparse_attention

F64 = torch.float64


def make_dsa(s_q=6, s_kv=10, h=2, d_qk=16, topk=5, seed=0, dtype=F64, sink=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h, d_qk, generator=g, dtype=dtype).requires_grad_()
    kv = torch.randn(s_kv, d_qk, generator=g, dtype=dtype).requires_grad_()
    # Every row keeps distinct in-range keys plus a few inactive slots.
    idx = torch.stack([torch.randperm(s_kv, generator=g)[:topk] for _ in range(s_q)]).int()
    idx[1, 2] = -1  # inactive: negative
    idx[2, 0] = s_kv + 3  # inactive: too large
    idx[3, 4] = idx[3, 1]  # a repeated key counts twice
    s = torch.randn(h, generator=g, dtype=dtype).requires_grad_() if sink else None
    return q, kv, idx, s


def test_forward_and_gradients_match_dense_oracle():
    q, kv, idx, sink = make_dsa()
    length = torch.tensor([5, 3, 0, 5, 7, 1], dtype=torch.int32)  # 0: empty row, 7: clamped
    out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, sink=sink, d_v=8)
    out_ref, lse_ref = dsa_dense(q, kv, idx, length, sink, d_v=8)
    torch.testing.assert_close(out, out_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-5, rtol=1e-6)
    assert torch.all(lse[2] == float("inf")) and torch.all(out[2] == 0)  # empty row

    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, kv, sink), dout)
    grads_ref = torch.autograd.grad(out_ref, (q, kv, sink), dout)
    for g, g_ref, name in zip(grads, grads_ref, ("q", "kv", "sink")):
        assert g.dtype == g_ref.dtype
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5, msg=lambda m: "d%s: %s" % (name, m))


def test_gradcheck_q_kv():
    # D_qk = 16, d_v = 8, with a sink (fixed here; its own check follows).
    q, kv, idx, sink = make_dsa(seed=1)
    sink = sink.detach().float()
    length = torch.tensor([5, 4, 5, 2, 5, 5], dtype=torch.int32)

    def fn(q, kv):
        return deepseek_sparse_attention(q, kv, idx, topk_length=length, sink=sink, d_v=8)[0]

    assert torch.autograd.gradcheck(fn, (q, kv), fast_mode=True)


def test_gradcheck_sink():
    # The sink is fp32 in the library, so its finite differences need a larger step.
    q, kv, idx, sink = make_dsa(seed=2)
    q, kv = q.detach(), kv.detach()

    def fn(sink):
        return deepseek_sparse_attention(q, kv, idx, sink=sink, d_v=8)[0]

    assert torch.autograd.gradcheck(fn, (sink,), eps=1e-3, atol=1e-4, rtol=1e-3, fast_mode=True)


def test_no_sink_and_no_length():
    q, kv, idx, _ = make_dsa(sink=False)
    out, lse = deepseek_sparse_attention(q, kv, idx, d_v=8, scale=0.3)
    out_ref, lse_ref = dsa_dense(q, kv, idx, d_v=8, scale=0.3)
    torch.testing.assert_close(out, out_ref, atol=1e-10, rtol=1e-10)
    out.sum().backward()
    assert q.grad is not None and kv.grad is not None


def test_infinite_sinks():
    q, kv, idx, _ = make_dsa(sink=False)
    sink = torch.tensor([float("inf"), float("-inf")])
    out, lse = deepseek_sparse_attention(q, kv, idx, sink=sink, d_v=8)
    assert torch.all(out[:, 0] == 0)  # +inf sink takes all the probability
    out_ref, _ = dsa_dense(q, kv, idx, d_v=8)  # -inf sink: no sink
    torch.testing.assert_close(out[:, 1], out_ref[:, 1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_inputs_on_cpu(dtype):
    q, kv, idx, sink = make_dsa(s_q=4, s_kv=64, h=2, d_qk=64, topk=16, dtype=dtype)
    sink = sink.detach().float().requires_grad_()
    out, lse = deepseek_sparse_attention(q, kv, idx, sink=sink, d_v=32)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == (4, 2, 32)
    out_ref, _ = dsa_dense(q.double(), kv.double(), idx, sink=sink.double(), d_v=32)
    err = (out.double() - out_ref).norm() / out_ref.norm()
    assert err < 1e-2, "relative L2 error %.3g" % err
    out.float().sum().backward()
    assert q.grad.dtype == dtype and kv.grad.dtype == dtype and sink.grad.dtype == torch.float32


def test_int64_indices_and_deterministic():
    q, kv, idx, sink = make_dsa()
    results = []
    for _ in range(2):
        out, _ = deepseek_sparse_attention(q, kv, idx.long(), sink=sink, d_v=8, deterministic=True)
        results.append(torch.autograd.grad(out.sum(), (q, kv, sink)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
