"""CUDA tests (skipped without a CUDA device).

Every shape used here is one the README's "What runs where" table says a GPU path serves on a
device of compute capability 8.0 or newer, so there a NotImplementedError is a dispatch
regression and fails the test. Only a device the table leaves out (older than sm80) skips. A
shape the table says no GPU path serves (BSA with D != D_v) is a test of the refusal's message.

  - values and gradients against the fp64 reference (the library's CPU path on fp64 copies);
  - torch.compile(fullgraph=True) with inductor, forward and backward;
  - CUDA graph capture on a side stream and replay with changed metadata;
  - the current stream is used (a capture would fail on any launch to another stream);
  - a short loop, inference and training (forward, backward, AdamW step): no growth of
    torch.cuda.memory_allocated, no host synchronisation (torch.cuda.set_sync_debug_mode("error")).

Compile, graph and loop tests run in two modes: "forward" needs only the forward kernels,
"training" the backward ones too.
"""

import pytest
import torch

from sparse_attention import (
    block_sparse_attention,
    bsa_metadata_from_block_mask,
    deepseek_sparse_attention,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEV = "cuda"
BF16 = torch.bfloat16


# ---- inputs -------------------------------------------------------------------------------------
def bsa_inputs(b=2, hq=4, hkv=2, s_q=512, s_kv=384, d=64, dv=64, block=64, layout="bhsd",
               density=0.5, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)

    def t(h, s, dd):
        shape = (b, h, s, dd) if layout == "bhsd" else (b, s, h, dd)
        return torch.randn(shape, generator=g).to(DEV, BF16).requires_grad_(requires_grad)

    q, k, v = t(hq, s_q, d), t(hkv, s_kv, d), t(hkv, s_kv, dv)
    n_q, n_kv = -(-s_q // block), -(-s_kv // block)
    mask = torch.rand(b, hq, n_q, n_kv, generator=g) < density
    mask[0, 0, 0] = False  # one empty row
    idx, cnt = bsa_metadata_from_block_mask(mask.to(DEV))
    return q, k, v, idx, cnt


def dsa_inputs(s_q=64, s_kv=512, h=16, d_qk=576, topk=128, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(s_q, h, d_qk, generator=g) * 0.5).to(DEV, BF16).requires_grad_(requires_grad)
    kv = (torch.randn(s_kv, d_qk, generator=g) * 0.5).to(DEV, BF16).requires_grad_(requires_grad)
    idx = torch.stack([torch.randperm(s_kv, generator=g)[:topk] for _ in range(s_q)]).int()
    idx[:, -8:] = -1  # inactive slots
    length = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32)
    length[0] = 0  # an empty row
    sink = torch.randn(h, generator=g).to(DEV).requires_grad_(requires_grad)
    return q, kv, idx.to(DEV), length.to(DEV), sink


# ---- which devices the documented GPU paths serve ------------------------------------------------
def require(*ops):
    """Skips on a device the README's table leaves out (the GPU paths need sm80 or newer);
    elsewhere every operation of these tests is documented as served, and runs."""
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("the GPU paths need compute capability 8.0 or newer (this device: %d.%d)"
                    % (major, minor))


# ---- comparisons with the fp64 reference ----------------------------------------------------------
def rel_l2(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_close_to_reference(name, x, ref, tol=1e-2):
    x, ref = x.detach().cpu(), ref.detach().cpu()
    assert torch.equal(torch.isnan(x), torch.isnan(ref)), name + ": NaN positions differ"
    assert torch.equal(torch.isinf(x), torch.isinf(ref)), name + ": inf positions differ"
    finite = torch.isfinite(ref)
    err = rel_l2(torch.where(finite, x.double(), 0), torch.where(finite, ref.double(), 0))
    assert err < tol, "%s: relative L2 error %.3g against the fp64 reference" % (name, err)


def fp64_cpu(*tensors):
    return [None if t is None else
            (t.detach().double().cpu().requires_grad_(t.requires_grad) if t.is_floating_point()
             else t.cpu()) for t in tensors]


# ---- tests that need no kernel -------------------------------------------------------------------
def test_unserved_request_raises_not_implemented():
    q, k, v, idx, cnt = bsa_inputs(b=1, hq=2, hkv=2, s_q=128, s_kv=128, requires_grad=False)
    with pytest.raises(NotImplementedError, match=r"SA_ERROR_UNSUPPORTED: bsa_forward: no implementation serves this call"):
        block_sparse_attention(q.double(), k.double(), v.double(), idx, cnt, block_size=64)


def test_device_mismatch_is_an_argument_error():
    q, k, v, idx, cnt = bsa_inputs(b=1, hq=2, hkv=2, s_q=128, s_kv=128, requires_grad=False)
    with pytest.raises(ValueError, match=r"expected device cuda:0 like the other tensors, got cpu"):
        block_sparse_attention(q, k, v, idx.cpu(), cnt, block_size=64)


def test_misaligned_pointer_is_an_argument_error():
    q, k, v, idx, cnt = bsa_inputs(b=1, hq=2, hkv=2, s_q=128, s_kv=128, requires_grad=False)
    buf = torch.empty(q.numel() + 1, dtype=BF16, device=DEV)
    q_off = buf[1:].view(q.shape)  # 2-byte offset
    with pytest.raises(ValueError, match=r"q: CUDA data pointer must be 16-byte aligned"):
        block_sparse_attention(q_off, k, v, idx, cnt, block_size=64)


# ---- BSA against the reference -------------------------------------------------------------------
BSA_CASES = [
    # name, kwargs for bsa_inputs
    ("d64_b64_bhsd_gqa", dict(d=64, dv=64, block=64, layout="bhsd")),
    ("d128_b128_bshd", dict(d=128, dv=128, block=128, layout="bshd", hkv=4)),
    ("d128_b64_mqa_ragged", dict(d=128, dv=128, block=64, hkv=1, s_q=300, s_kv=200)),
]


def _bsa_pair(kw):
    kw = dict(dict(block=64, layout="bhsd"), **kw)
    q, k, v, idx, cnt = bsa_inputs(**kw)
    o, lse = block_sparse_attention(q, k, v, idx, cnt, block_size=kw["block"], layout=kw["layout"])
    q64, k64, v64, idx64, cnt64 = fp64_cpu(q, k, v, idx, cnt)
    o_ref, lse_ref = block_sparse_attention(q64, k64, v64, idx64, cnt64, block_size=kw["block"],
                                            layout=kw["layout"])
    return (q, k, v, o, lse), (q64, k64, v64, o_ref, lse_ref)


@pytest.mark.parametrize("case", BSA_CASES, ids=[c[0] for c in BSA_CASES])
def test_bsa_forward_matches_fp64_reference(case):
    require("bsa_fwd")
    (_, _, _, o, lse), (_, _, _, o_ref, lse_ref) = _bsa_pair(case[1])
    assert o.dtype == BF16 and o.shape == o_ref.shape
    assert_close_to_reference("o", o, o_ref)
    torch.testing.assert_close(lse.cpu(), lse_ref, atol=1e-3, rtol=0)


@pytest.mark.parametrize("case", BSA_CASES, ids=[c[0] for c in BSA_CASES])
def test_bsa_gradients_match_fp64_reference(case):
    require("bsa_fwd", "bsa_bwd")
    (q, k, v, o, _), (q64, k64, v64, o_ref, _) = _bsa_pair(case[1])
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, (q64, k64, v64), do.double().cpu())
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert g.dtype == BF16
        assert_close_to_reference(name, g, g_ref)


def test_bsa_d_ne_dv_is_refused_naming_the_reason():
    """SPEC allows D != D_v (the CPU reference serves it); no GPU path does yet, and the README
    says so: the refusal names the head dims of each GPU path, and nothing silently falls back."""
    require("bsa_fwd")
    q, k, v, idx, cnt = bsa_inputs(d=128, dv=64, block=64, hkv=1, requires_grad=False)
    with pytest.raises(NotImplementedError) as e:
        block_sparse_attention(q, k, v, idx, cnt, block_size=64)
    msg = str(e.value)
    assert "SA_ERROR_UNSUPPORTED: bsa_forward: no implementation serves this call" in msg, msg
    assert "portable: D = 128, D_v = 64" in msg, msg
    assert "reference: needs CPU tensors" in msg, msg


def test_bsa_deterministic_gradients_are_bitwise_identical():
    require("bsa_fwd", "bsa_bwd")
    q, k, v, idx, cnt = bsa_inputs()
    runs = []
    for _ in range(3):
        o, _ = block_sparse_attention(q, k, v, idx, cnt, block_size=64, deterministic=True)
        runs.append(torch.autograd.grad(o.float().square().sum(), (q, k, v)))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


# ---- DSA against the reference -------------------------------------------------------------------
def _dsa_pair(d_qk):
    q, kv, idx, length, sink = dsa_inputs(d_qk=d_qk)
    out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, sink=sink)
    q64, kv64, idx64, len64, sink64 = fp64_cpu(q, kv, idx, length, sink)
    sink64 = sink64.detach().float().requires_grad_()
    out_ref, lse_ref = deepseek_sparse_attention(q64, kv64, idx64, topk_length=len64, sink=sink64)
    return (q, kv, sink, out, lse), (q64, kv64, sink64, out_ref, lse_ref)


@pytest.mark.parametrize("d_qk", [576, 512])
def test_dsa_forward_matches_fp64_reference(d_qk):
    require("dsa_fwd")
    (_, _, _, out, lse), (_, _, _, out_ref, lse_ref) = _dsa_pair(d_qk)
    assert_close_to_reference("out", out, out_ref)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert torch.all(lse.cpu()[~finite] == float("inf"))  # empty rows
    torch.testing.assert_close(lse.cpu()[finite], lse_ref[finite], atol=1e-3, rtol=0)


@pytest.mark.parametrize("d_qk", [576, 512])
def test_dsa_gradients_match_fp64_reference(d_qk):
    require("dsa_fwd", "dsa_bwd")
    (q, kv, sink, out, _), (q64, kv64, sink64, out_ref, _) = _dsa_pair(d_qk)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, kv, sink), dout)
    grads_ref = torch.autograd.grad(out_ref, (q64, kv64, sink64), dout.double().cpu())
    for name, g, g_ref in zip(("dq", "dkv", "d_sink"), grads, grads_ref):
        assert_close_to_reference(name, g, g_ref)


def test_dsa_deterministic_gradients_are_bitwise_identical():
    require("dsa_fwd", "dsa_bwd")
    q, kv, idx, length, sink = dsa_inputs()
    runs = []
    for _ in range(3):
        out, _ = deepseek_sparse_attention(q, kv, idx, topk_length=length, sink=sink,
                                           deterministic=True)
        runs.append(torch.autograd.grad(out.float().square().sum(), (kv, sink)))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


# ---- torch.compile ---------------------------------------------------------------------------------
# "forward": inference only (needs the forward kernels); "training": forward and backward.
MODES = ["forward", "training"]


def _ops_for(mode, *names):
    return [n + "_fwd" for n in names] + ([n + "_bwd" for n in names] if mode == "training" else [])


@pytest.mark.parametrize("mode", MODES)
def test_compile_fullgraph_bsa_and_dsa(mode):
    require(*_ops_for(mode, "bsa", "dsa"))
    train = mode == "training"
    q, k, v, idx, cnt = bsa_inputs(requires_grad=train)
    dq_, kv, didx, length, sink = dsa_inputs(requires_grad=train)

    def fn(q, k, v, idx, cnt, dq_, kv, didx, length, sink):
        o, lse = block_sparse_attention(q, k, v, idx, cnt, block_size=64)
        out, _ = deepseek_sparse_attention(dq_, kv, didx, topk_length=length, sink=sink)
        return (o.float() * torch.sigmoid(lse).unsqueeze(-1)).square().mean() + out.float().square().mean()

    args = (q, k, v, idx, cnt, dq_, kv, didx, length, sink)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    got, want = compiled(*args), fn(*args)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    if train:
        params = (q, k, v, dq_, kv, sink)
        for a, b in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


# ---- CUDA graphs and streams -------------------------------------------------------------------------
def _capture(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on its own side stream: a launch elsewhere fails
        static_out = step()
    return graph, static_out


def _same(name, a, b):
    # Replays of the same kernels on the same inputs: identical unless a path uses atomics.
    assert torch.equal(a, b) or torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2,
                                               equal_nan=True), name


@pytest.mark.parametrize("mode", MODES)
def test_bsa_cuda_graph_replay_with_changed_metadata(mode):
    require(*_ops_for(mode, "bsa"))
    train = mode == "training"
    q, k, v, idx, cnt = bsa_inputs(requires_grad=train)
    do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=DEV, dtype=BF16)
    static_idx, static_cnt = idx.clone(), cnt.clone()

    def step():
        o, lse = block_sparse_attention(q, k, v, static_idx, static_cnt, block_size=64)
        return (o, lse) + (torch.autograd.grad(o, (q, k, v), do) if train else ())

    graph, static_out = _capture(step)
    for seed in (1, 2):
        before = static_out[0].clone()
        _, _, _, new_idx, new_cnt = bsa_inputs(seed=seed, requires_grad=False)
        static_idx.copy_(new_idx)
        static_cnt.copy_(new_cnt)
        graph.replay()
        assert not torch.equal(before, static_out[0]), "the replay did not see the new metadata"
        want = step()
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), static_out, want):
            _same(name, a, b)


@pytest.mark.parametrize("mode", MODES)
def test_dsa_cuda_graph_replay_with_changed_indices(mode):
    require(*_ops_for(mode, "dsa"))
    train = mode == "training"
    q, kv, idx, length, sink = dsa_inputs(requires_grad=train)
    dout = torch.randn(q.shape[0], q.shape[1], 512, device=DEV, dtype=BF16)
    static_idx, static_len = idx.clone(), length.clone()

    def step():
        out, lse = deepseek_sparse_attention(q, kv, static_idx, topk_length=static_len, sink=sink)
        return (out, lse) + (torch.autograd.grad(out, (q, kv, sink), dout) if train else ())

    graph, static_out = _capture(step)
    before = [t.clone() for t in static_out]
    _, _, new_idx, new_len, _ = dsa_inputs(seed=5, requires_grad=False)
    static_idx.copy_(new_idx)
    static_len.copy_(new_len)
    graph.replay()
    assert not torch.equal(before[0], static_out[0]), "the replay did not see the new indices"
    want = step()
    for name, a, b in zip(("out", "lse", "dq", "dkv", "d_sink"), static_out, want):
        _same(name, a, b)


def test_runs_on_the_current_stream():
    require("bsa_fwd")
    q, k, v, idx, cnt = bsa_inputs(requires_grad=False)
    want, _ = block_sparse_attention(q, k, v, idx, cnt, block_size=64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the side stream is busy for a while ...
        q_side = q.clone()  # ... before q_side is written: a launch on another stream reads garbage
        got, _ = block_sparse_attention(q_side, k, v, idx, cnt, block_size=64)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


# ---- a training loop -----------------------------------------------------------------------------
class BsaBlock(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2, head_dim=64):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, idx, cnt):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d)
        k, v = self.kv(x).view(b, s, 2, self.hkv, self.d).unbind(2)
        o, _ = block_sparse_attention(q, k, v, idx, cnt, block_size=64, layout="bshd")
        return self.o(o.reshape(b, s, -1))


class DsaBlock(torch.nn.Module):
    def __init__(self, dim=256, heads=16, d_qk=576):
        super().__init__()
        self.h, self.d = heads, d_qk
        self.q = torch.nn.Linear(dim, heads * d_qk, bias=False)
        self.kv = torch.nn.Linear(dim, d_qk, bias=False)
        self.o = torch.nn.Linear(heads * 512, dim, bias=False)
        self.sink = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float32))

    def forward(self, x, topk_idx):
        s = x.shape[0]
        out, _ = deepseek_sparse_attention(self.q(x).view(s, self.h, self.d), self.kv(x), topk_idx,
                                           sink=self.sink)
        return self.o(out.reshape(s, -1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["bsa", "dsa"])
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")
def test_loop_no_leaks_no_host_syncs(op, mode):
    require(*_ops_for(mode, op))
    train = mode == "training"
    torch.manual_seed(0)
    if op == "bsa":
        model = BsaBlock().to(DEV, BF16)
        x = torch.randn(2, 512, 256, device=DEV, dtype=BF16)
        n = 512 // 64
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=DEV)).expand(2, 4, n, n)
        meta = bsa_metadata_from_block_mask(mask)
    else:
        model = DsaBlock().to(DEV)
        for layer in (model.q, model.kv, model.o):
            layer.to(BF16)  # the sink stays fp32
        x = torch.randn(256, 256, device=DEV, dtype=BF16)
        causal = torch.arange(256, device=DEV)
        topk_idx = (torch.randint(0, 256, (256, 64), device=DEV) % (causal[:, None] + 1)).int()
        meta = (topk_idx,)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step():
        with torch.set_grad_enabled(train):
            loss = model(x, *meta).float().square().mean()
        if train:  # a training step: forward, backward, optimizer step
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(3):  # warm-up: optimizer state, allocator pools
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    losses = []
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        for _ in range(10):
            losses.append(step())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    values = torch.stack(losses).cpu()
    del losses
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before, "memory grew by %d bytes" % (
        torch.cuda.memory_allocated() - before)
    assert torch.isfinite(values).all()
    if train:
        assert values[-1] < values[0], "the loss should go down: %s" % values.tolist()


# ---- the DSA lightning indexer (SPEC 5) ------------------------------------------------------------
# Each op on CUDA against the library's CPU reference on fp64 copies of the same values, with the
# tolerances of docs/indexer.md and tests/test_gpu_indexer*.cpp: scores within 1e-4 of the largest
# |score| (-inf at the same positions); top-k exactly SPEC 5's selection over the CUDA scores and
# near-optimal (within that score tolerance) over the reference's; the loss within 1e-4 of the sum
# of |per-token terms| and each term within 1e-4 of the largest; gradients rel L2 < 1e-2.
from sparse_attention import indexer_kl_loss, indexer_scores, indexer_topk  # noqa: E402

IDX_D = 128  # D_I: the GPU contract


def indexer_inputs(s_q=96, s_kv=160, h_i=16, h=16, d_qk=576, seed=0, requires_grad=True):
    """bf16 q_I, k_I, q, kv and fp32 w on CUDA, causal ranges (bottom-right aligned) with an
    empty row (t = 1) and a range clamped at both ends (t = 2)."""
    g = torch.Generator().manual_seed(seed)
    q_I = torch.randn(s_q, h_i, IDX_D, generator=g).to(DEV, BF16)
    k_I = torch.randn(s_kv, IDX_D, generator=g).to(DEV, BF16)
    w = (torch.rand(s_q, h_i, generator=g) * 2 - 0.5).to(DEV)
    q = (torch.randn(s_q, h, d_qk, generator=g) * 0.5).to(DEV, BF16)
    kv = (torch.randn(s_kv, d_qk, generator=g) * 0.5).to(DEV, BF16)
    k_start = torch.zeros(s_q, dtype=torch.int32)
    k_end = torch.arange(s_q, dtype=torch.int32) + 1 + (s_kv - s_q)
    k_start[1], k_end[1] = 5, 5
    k_start[2], k_end[2] = -7, s_kv + 9
    for t in (q_I, k_I, w):
        t.requires_grad_(requires_grad)
    return q_I, k_I, w, q, kv, k_start.to(DEV), k_end.to(DEV)


def scores_tolerance(ref):
    finite = ref[torch.isfinite(ref)]
    return 1e-4 * float(finite.abs().max().clamp_min(1e-30))


def assert_scores_close(got, ref):
    got, ref = got.detach().cpu().double(), ref.detach().cpu().double()
    assert not torch.isnan(got).any(), "NaN in the CUDA scores"
    assert torch.equal(torch.isinf(got), torch.isinf(ref)), "-inf positions differ"
    finite = torch.isfinite(ref)
    err = float((got[finite] - ref[finite]).abs().max()) if finite.any() else 0.0
    assert err <= scores_tolerance(ref), "scores: max error %.3g > %.3g" % (
        err, scores_tolerance(ref))


def select_topk(scores, topk):
    """SPEC 5's selection over `scores` [S_q, S_kv] (-inf outside the range): the `topk` largest,
    ties to the smaller key, in increasing key order, then -1; and the lengths."""
    s = scores.detach().cpu().float()
    n = torch.isfinite(s).sum(-1).clamp(max=topk)
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :topk]
    keep = torch.arange(order.shape[1])[None, :] < n[:, None]
    big = torch.iinfo(torch.int64).max
    chosen = torch.where(keep, order, big).sort(-1).values
    chosen = torch.where(chosen == big, -1, chosen)
    idx = torch.full((s.shape[0], topk), -1, dtype=torch.int32)
    idx[:, : chosen.shape[1]] = chosen.int()
    return idx, n.int()


def test_indexer_scores_match_cpu_reference():
    require("indexer")
    for h_i in (16, 64):
        q_I, k_I, w, _, _, k_start, k_end = indexer_inputs(h_i=h_i, seed=h_i, requires_grad=False)
        got = indexer_scores(q_I, k_I, w, k_start=k_start, k_end=k_end)
        assert got.device == q_I.device and got.dtype == torch.float32 and got.shape == (96, 160)
        q64, k64, w64, s64, e64 = fp64_cpu(q_I, k_I, w, k_start, k_end)
        assert_scores_close(got, indexer_scores(q64, k64, w64, k_start=s64, k_end=e64))


@pytest.mark.parametrize("topk", [1, 24, 200])
def test_indexer_topk_matches_its_scores_and_cpu_reference(topk):
    require("indexer")
    q_I, k_I, w, _, _, k_start, k_end = indexer_inputs(h_i=32, seed=topk, requires_grad=False)
    idx, length = indexer_topk(q_I, k_I, w, topk, k_start, k_end)
    assert idx.device == q_I.device and idx.dtype == torch.int32 and idx.shape == (96, topk)
    # Exactly SPEC 5's selection over the CUDA scores (the fused kernel ranks what the score
    # kernel writes), bitwise the same on a second call.
    want_idx, want_len = select_topk(indexer_scores(q_I, k_I, w, k_start=k_start, k_end=k_end), topk)
    assert torch.equal(idx.cpu(), want_idx) and torch.equal(length.cpu(), want_len)
    again = indexer_topk(q_I, k_I, w, topk, k_start, k_end)
    assert torch.equal(again[0], idx) and torch.equal(again[1], length)
    # Near-optimal over the fp64 reference's scores (bf16 inputs summed in fp32 may swap
    # near-ties), and the reference's own top-k has the same lengths.
    q64, k64, w64, s64, e64 = fp64_cpu(q_I, k_I, w, k_start, k_end)
    ref = indexer_scores(q64, k64, w64, k_start=s64, k_end=e64).double()
    ref_idx, ref_len = indexer_topk(q64, k64, w64, topk, s64, e64)
    assert torch.equal(ref_len, length.cpu())
    tol = scores_tolerance(ref)
    for t in range(ref.shape[0]):
        n = int(length[t])
        if n == 0:
            continue
        kth = ref[t, ref_idx[t, :n].long()].min()
        assert bool((ref[t, idx[t, :n].long().cpu()] >= kth - tol).all()), "row %d" % t


def _kl_case(sparse, seed=0, h_i=16, d_qk=576, deterministic=False):
    """(args, kwargs) of indexer_kl_loss on CUDA. Sparse: the indexer's top-k and the CUDA DSA
    forward's lse on it; dense: the dense attention's LSE over each range (torch, fp32)."""
    q_I, k_I, w, q, kv, k_start, k_end = indexer_inputs(h_i=h_i, d_qk=d_qk, seed=seed)
    if sparse:
        idx, length = indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 32, k_start, k_end)
        _, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length)
    else:
        idx = length = None
        keys = torch.arange(kv.shape[0], device=DEV)
        inside = (keys[None, :] >= k_start[:, None]) & (keys[None, :] < k_end[:, None])
        s = torch.einsum("thd,sd->ths", q.float(), kv.float()) / d_qk ** 0.5
        lse = torch.logsumexp(s.masked_fill(~inside[:, None, :], float("-inf")), -1)
        lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
    args = (q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end)
    return args, dict(coeff=0.7, deterministic=deterministic)


def _assert_loss_close(got, want, per_got, per_want):
    per_got, per_want = per_got.detach().cpu().double(), per_want.detach().cpu().double()
    assert not torch.isnan(per_got).any() and not torch.isnan(got).any()
    scale = float(per_want.abs().sum().clamp_min(1e-30))
    got, want = float(got.detach()), float(want.detach())
    assert abs(got - want) <= 1e-4 * scale, (got, want)
    assert float((per_got - per_want).abs().max()) <= 1e-4 * float(
        per_want.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_indexer_kl_loss_and_gradients_match_cpu_reference(mode):
    require("indexer")
    args, kw = _kl_case(mode == "sparse", seed=3)
    loss, per_token = indexer_kl_loss(*args, return_per_token=True, **kw)
    assert loss.device == args[0].device and loss.dtype == torch.float32 and loss.dim() == 0
    ref_args = fp64_cpu(*args)
    ref_args[5] = ref_args[5].float()  # lse: fp32, as on CUDA
    ref_loss, ref_per = indexer_kl_loss(*ref_args, return_per_token=True, **kw)
    _assert_loss_close(loss, ref_loss, per_token, ref_per)
    grads = torch.autograd.grad(loss * 1.3, args[:3])
    ref_grads = torch.autograd.grad(ref_loss * 1.3, ref_args[:3])
    for name, g, r in zip(("dq_I", "dk_I", "dw"), grads, ref_grads):
        assert g.device == args[0].device and g.dtype == (torch.float32 if name == "dw" else BF16)
        assert_close_to_reference(name, g, r)


def test_indexer_kl_loss_deterministic_gradients_are_bitwise_identical():
    require("indexer")
    args, kw = _kl_case(True, seed=4, deterministic=True)
    runs = [torch.autograd.grad(indexer_kl_loss(*args, **kw), args[:3]) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("mode,backend", [("sparse", "inductor"), ("dense", "aot_eager")])
def test_indexer_compile_fullgraph_topk_and_loss(mode, backend):
    # inductor once (sparse); aot_eager for dense mode keeps the module's time short (the ops are
    # opaque to both: the graph, the fake kernels and the autograd formula are what is tested).
    require("indexer")
    sparse = mode == "sparse"
    args, kw = _kl_case(sparse, seed=5, deterministic=sparse)
    q_I, k_I, w, q, kv, lse, _, _, k_start, k_end = args

    def fn(q_I, k_I, w):
        idx, length = (indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 32, k_start, k_end)
                       if sparse else (None, None))
        loss = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end, **kw)
        return loss, idx

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    (got, got_idx), (want, want_idx) = compiled(q_I, k_I, w), fn(q_I, k_I, w)
    if sparse:
        assert torch.equal(got_idx, want_idx)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(got, (q_I, k_I, w)), torch.autograd.grad(want, (q_I, k_I, w))):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


def test_indexer_cuda_graph_replay_topk_and_loss():
    require("indexer")
    args, kw = _kl_case(True, seed=6, deterministic=True)
    q_I, k_I, w, q, kv, lse, _, _, k_start, k_end = args
    static_q_I = q_I.detach().clone().requires_grad_()

    def step():
        idx, length = indexer_topk(static_q_I.detach(), k_I.detach(), w.detach(), 32, k_start,
                                   k_end)
        loss = indexer_kl_loss(static_q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end, **kw)
        return (idx, length, loss) + torch.autograd.grad(loss, (static_q_I, k_I, w))

    graph, static_out = _capture(step)
    before = [t.clone() for t in static_out]
    with torch.no_grad():
        static_q_I.copy_(torch.randn_like(static_q_I))
    graph.replay()
    assert not torch.equal(before[0], static_out[0]), "the replay did not see the new q_I"
    want = step()
    for name, a, b in zip(("topk_idx", "topk_length", "loss", "dq_I", "dk_I", "dw"), static_out,
                          want):
        assert torch.equal(a, b), name  # deterministic mode: bitwise


def test_indexer_fake_kernels_on_cuda():
    require("indexer")
    args, _ = _kl_case(True, seed=7)
    q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end = args
    ops = torch.ops.sparse_attention
    plain = (q_I.detach(), k_I.detach(), w.detach())
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(ops.indexer_scores, plain + (k_start, k_end, 0.0), test_utils=checks)
    torch.library.opcheck(ops.indexer_topk, plain + (k_start, k_end, 32, 0.0), test_utils=checks)
    for sparse in (True, False):
        loss_args = (q_I, k_I, w, q, kv, lse, idx if sparse else None,
                     length if sparse else None, k_start, k_end, 0.5, 0.0, 0.0, sparse, True)
        torch.library.opcheck(ops.indexer_loss, loss_args,
                              test_utils=checks + ("test_autograd_registration",))
