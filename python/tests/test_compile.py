"""The operators behave like native ones for the PyTorch stack: torch.library.opcheck (schema,
fake kernel, autograd registration, AOT dispatch) and torch.compile(fullgraph=True) of forward
and backward, on CPU."""

import pytest
import torch

import sparse_attention  # noqa: F401
from sparse_attention import block_sparse_attention, deepseek_sparse_attention

ops = torch.ops.sparse_attention


def bsa_case(requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 8, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
               for _ in range(3))
    idx = torch.tensor([[[[0, 1], [1, 0]], [[1, 0], [0, 1]]]], dtype=torch.int32)
    cnt = torch.tensor([[[1, 2], [2, 0]]], dtype=torch.int32)
    return q, k, v, idx, cnt


def dsa_case(requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 2, 16, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
    kv = torch.randn(10, 16, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
    idx = torch.randint(-1, 10, (6, 4), generator=g, dtype=torch.int32)
    length = torch.tensor([4, 3, 0, 4, 2, 4], dtype=torch.int32)
    sink = torch.randn(2, generator=g).requires_grad_(requires_grad)
    return q, kv, idx, length, sink


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def test_opcheck_bsa():
    q, k, v, idx, cnt = bsa_case()
    torch.library.opcheck(ops.bsa_fwd, (q, k, v, idx, cnt, None, 64, 0, -1, 0.0, 0, False, False),
                          test_utils=OPCHECK_TESTS)
    o, lse = ops.bsa_fwd(q, k, v, idx, cnt, None, 64, 0, -1, 0.0, 0, False, False)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse, idx, cnt,
            None, 64, 0, -1, 0.0, 0, False, False)
    torch.library.opcheck(ops.bsa_bwd, args, test_utils=OPCHECK_TESTS[:1] + OPCHECK_TESTS[2:])


def test_opcheck_dsa():
    q, kv, idx, length, sink = dsa_case()
    torch.library.opcheck(ops.dsa_fwd, (q, kv, idx, length, sink, 8, 0.0, False),
                          test_utils=OPCHECK_TESTS)
    out, lse = ops.dsa_fwd(q, kv, idx, length, sink, 8, 0.0, False)
    args = (torch.randn_like(out), q.detach(), kv.detach(), out.detach(), lse, idx, length,
            sink.detach(), 8, 0.0, False)
    torch.library.opcheck(ops.dsa_bwd, args, test_utils=OPCHECK_TESTS[:1] + OPCHECK_TESTS[2:])


def _grads(fn, inputs):
    out = fn(*inputs)
    loss = (out[0] * torch.linspace(-1, 1, out[0].numel(), dtype=out[0].dtype).view_as(out[0])).sum()
    return [out[0].detach()] + list(torch.autograd.grad(loss, [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_bsa(backend):
    q, k, v, idx, cnt = bsa_case()

    def fn(q, k, v, idx, cnt):
        o, lse = block_sparse_attention(q * 1.5, k, v, idx, cnt, block_size=64)
        return o * torch.sigmoid(lse).unsqueeze(-1), lse

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(_grads(compiled, (q, k, v, idx, cnt)), _grads(fn, (q, k, v, idx, cnt))):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_dsa(backend):
    q, kv, idx, length, sink = dsa_case()

    def fn(q, kv, idx, length, sink):
        out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, sink=sink * 2, d_v=8)
        return out.relu(), lse

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(_grads(compiled, (q, kv, idx, length, sink)), _grads(fn, (q, kv, idx, length, sink))):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_compile_dynamic_shapes_bsa():
    # Two sequence lengths through one dynamic graph: the fake kernels handle symbolic sizes.
    def fn(q, k, v, idx):
        return block_sparse_attention(q, k, v, idx, block_size=64)[0].sum()

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for s in (128, 192):
        q, k, v = (torch.randn(1, 2, s, 8, dtype=torch.float64) for _ in range(3))
        n = -(-s // 64)
        idx = torch.arange(n, dtype=torch.int32).expand(1, 2, n, n).contiguous()
        torch.testing.assert_close(compiled(q, k, v, idx), fn(q, k, v, idx))


def test_compile_reports_argument_errors():
    q, k, v, idx, _ = bsa_case(requires_grad=False)

    def fn(q, k, v, idx):
        return block_sparse_attention(q, k, v, idx, block_size=96)[0]

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"options\.block_size: expected 64 or 128, got 96"):
        torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, idx)
