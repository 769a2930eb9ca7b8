"""The DSA lightning indexer (SPEC 5) through the package on CPU (the library's fp64 reference):
scores, top-k and the KL loss against float64 torch oracles written here from SPEC 5, gradients
against torch autograd of the oracle and gradcheck, the top-k feeding deepseek_sparse_attention,
torch.library.opcheck and torch.compile(fullgraph=True), and errors that name the argument."""

import pytest
import torch

from conftest import dsa_dense, fp32_scale
from sparse_attention import (deepseek_sparse_attention, indexer_kl_loss, indexer_scores,
                              indexer_topk)

F64 = torch.float64
ops = torch.ops.sparse_attention


# ---- oracles -------------------------------------------------------------------------------------
def range_mask(s_q, s_kv, k_start=None, k_end=None):
    """[S_q, S_kv] bool: key s is in query t's range (SPEC 5; values clamped to [0, S_kv])."""
    s = torch.arange(s_kv)[None, :]
    lo = torch.zeros(s_q, 1, dtype=torch.long) if k_start is None else k_start.long()[:, None]
    hi = torch.full((s_q, 1), s_kv) if k_end is None else k_end.long()[:, None]
    return (s >= lo) & (s < hi)


def oracle_logits(q_I, k_I, w, scale_I=None):
    """I[t, s] for every pair, differentiable, in the inputs' dtype."""
    scale_I = fp32_scale(scale_I, q_I.shape[-1])
    a = scale_I * torch.einsum("tjd,sd->tjs", q_I, k_I)
    return (w[:, :, None] * a.relu()).sum(1)


def oracle_scores(q_I, k_I, w, k_start=None, k_end=None, scale_I=None):
    mask = range_mask(q_I.shape[0], k_I.shape[0], k_start, k_end)
    return oracle_logits(q_I, k_I, w, scale_I).masked_fill(~mask, float("-inf"))


def oracle_topk(scores, topk):
    """Top-k of fp32 scores: stable descending sort (ties keep the smaller key first), the first
    min(topk, keys in range), increasing key order, then -1."""
    s32 = scores.float()
    order = torch.sort(s32, dim=-1, descending=True, stable=True).indices
    n = torch.isfinite(s32).sum(-1).clamp(max=topk)
    idx = torch.full((scores.shape[0], topk), -1, dtype=torch.int32)
    for t in range(scores.shape[0]):
        chosen = order[t, : int(n[t])].sort().values
        idx[t, : len(chosen)] = chosen.int()
    return idx, n.int()


def oracle_kl(q_I, k_I, w, q, kv, lse, keys, active, coeff=1.0, scale=None, scale_I=None):
    """Per-token KL terms over key lists `keys` [S_q, K] with `active` [S_q, K] (one term per
    entry), differentiable in q_I, k_I, w."""
    s_kv = kv.shape[0]
    safe = keys.long().clamp(0, s_kv - 1)
    scale = fp32_scale(scale, q.shape[-1])
    logits = oracle_logits(q_I, k_I, w, scale_I).gather(1, safe)  # [S_q, K]
    s = scale * torch.einsum("thd,tkd->thk", q.double(), kv.double()[safe])
    a = torch.exp(s - lse.double()[:, :, None]).sum(1)  # A[t, s]; a head with lse = +inf: 0
    a = torch.where(active, a, torch.zeros_like(a))
    mass = a.sum(-1, keepdim=True)
    row_ok = (mass > 0).squeeze(-1)
    p = a / torch.where(mass > 0, mass, torch.ones_like(mass))
    # log r over the active entries; rows with none get a dummy all-true mask (p = 0 there).
    mask = active | ~active.any(-1, keepdim=True)
    log_r = logits - torch.logsumexp(logits.masked_fill(~mask, float("-inf")), -1, keepdim=True)
    p_safe = torch.where(p > 0, p, torch.ones_like(p))
    terms = torch.where(p > 0, p * (torch.log(p_safe) - log_r), torch.zeros_like(p))
    return coeff * terms.sum(-1) * row_ok


def sparse_active(topk_idx, topk_length, s_kv, k_start=None, k_end=None):
    s_q, topk = topk_idx.shape
    idx = topk_idx.long()
    act = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        act &= torch.arange(topk)[None, :] < topk_length.long()[:, None]
    if k_start is not None:
        act &= idx >= k_start.long()[:, None]
    if k_end is not None:
        act &= idx < k_end.long()[:, None]
    return act


def dense_keys(s_q, s_kv, k_start=None, k_end=None):
    return torch.arange(s_kv).expand(s_q, s_kv), range_mask(s_q, s_kv, k_start, k_end)


# ---- inputs --------------------------------------------------------------------------------------
def make_case(s_q=8, s_kv=12, h_i=3, d_i=8, h=2, d_qk=16, seed=0, dtype=F64, grad=True):
    g = torch.Generator().manual_seed(seed)
    q_I = torch.randn(s_q, h_i, d_i, generator=g, dtype=dtype)
    k_I = torch.randn(s_kv, d_i, generator=g, dtype=dtype)
    w = torch.rand(s_q, h_i, generator=g, dtype=F64 if dtype == F64 else torch.float32) * 2 - 0.5
    q = torch.randn(s_q, h, d_qk, generator=g, dtype=dtype)
    kv = torch.randn(s_kv, d_qk, generator=g, dtype=dtype)
    for t in (q_I, k_I, w):
        t.requires_grad_(grad)
    return q_I, k_I, w, q, kv


def causal(s_q, s_kv):
    return torch.zeros(s_q, dtype=torch.int32), (torch.arange(s_q) + 1 + s_kv - s_q).int()


def packed():
    # Two sequences of 3 + 5 queries over 4 + 8 keys, causal inside each; plus oddities: an empty
    # range (row 2), a range clamped at both ends (row 7).
    k_start = torch.tensor([0, 0, 3, 4, 4, 4, 4, -5], dtype=torch.int32)
    k_end = torch.tensor([2, 3, 3, 8, 9, 10, 11, 40], dtype=torch.int32)
    return k_start, k_end


RANGES = {"full": lambda: (None, None), "causal": lambda: causal(8, 12), "packed": packed}


# ---- scores and top-k ----------------------------------------------------------------------------
@pytest.mark.parametrize("ranges", sorted(RANGES))
def test_scores_match_oracle(ranges):
    q_I, k_I, w, _, _ = make_case(grad=False)
    k_start, k_end = RANGES[ranges]()
    got = indexer_scores(q_I, k_I, w, k_start=k_start, k_end=k_end)
    want = oracle_scores(q_I, k_I, w, k_start, k_end)
    assert got.dtype == torch.float32 and got.shape == (8, 12)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want.float(), atol=0, rtol=1e-6)
    got2 = indexer_scores(q_I, k_I, w, scale=0.3, k_start=k_start, k_end=k_end)
    torch.testing.assert_close(got2, oracle_scores(q_I, k_I, w, k_start, k_end, 0.3).float(),
                               atol=0, rtol=1e-6)


@pytest.mark.parametrize("ranges", sorted(RANGES))
@pytest.mark.parametrize("topk", [1, 3, 7, 16])
def test_topk_matches_oracle(ranges, topk):
    q_I, k_I, w, _, _ = make_case(grad=False, seed=1)
    k_start, k_end = RANGES[ranges]()
    idx, length = indexer_topk(q_I, k_I, w, topk, k_start=k_start, k_end=k_end)
    want_idx, want_len = oracle_topk(indexer_scores(q_I, k_I, w, k_start=k_start, k_end=k_end),
                                     topk)
    assert idx.dtype == torch.int32 and length.dtype == torch.int32
    assert torch.equal(idx, want_idx) and torch.equal(length, want_len)
    # topk_length = min(k, k_end - k_start) for ranges inside [0, S_kv]
    mask = range_mask(8, 12, k_start, k_end)
    assert torch.equal(length.long(), mask.sum(-1).clamp(max=topk))
    idx2, _ = indexer_topk(q_I, k_I, w, topk, k_start=k_start, k_end=k_end)
    assert torch.equal(idx, idx2)  # deterministic


def test_topk_ties_go_to_the_smaller_key():
    q_I, k_I, w, _, _ = make_case(grad=False, seed=2)
    k_I = k_I[torch.arange(12) % 3]  # keys repeat: equal scores in threes
    idx, _ = indexer_topk(q_I, k_I, w, 5)
    want, _ = oracle_topk(oracle_scores(q_I, k_I, w), 5)
    assert torch.equal(idx, want)
    zero = torch.zeros_like(q_I)  # every score 0: the first k keys of the range
    k_start, k_end = causal(8, 12)
    idx, length = indexer_topk(zero, k_I, w, 6, k_start + 2, k_end)
    for t in range(8):
        n = int(length[t])
        assert idx[t, :n].tolist() == list(range(2, 2 + n)) and (idx[t, n:] == -1).all()


def test_topk_feeds_deepseek_sparse_attention():
    # Top-k of the indexer straight into DSA: the same as dense attention over the chosen keys.
    q_I, k_I, w, q, kv = make_case(grad=False, seed=3)
    k_start, k_end = packed()
    idx, length = indexer_topk(q_I, k_I, w, 4, k_start, k_end)
    out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    out_ref, lse_ref = dsa_dense(q, kv, idx, length, d_v=8)
    torch.testing.assert_close(out, out_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lse, lse_ref.float())
    assert torch.all(lse[2] == float("inf"))  # the empty range: an empty attention row


# ---- the KL loss ---------------------------------------------------------------------------------
def attention_lse(q, kv, keys, active, scale=None):
    s = fp32_scale(scale, q.shape[-1]) * torch.einsum("thd,tkd->thk", q, kv[keys.long().clamp(0)])
    return torch.logsumexp(s.masked_fill(~active[:, None, :], float("-inf")), -1).float()


@pytest.mark.parametrize("ranges", sorted(RANGES))
def test_sparse_loss_and_gradients_match_oracle(ranges):
    q_I, k_I, w, q, kv = make_case(seed=4)
    k_start, k_end = RANGES[ranges]()
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(-1, 13, (8, 6), generator=g, dtype=torch.int32)  # -1 and 12: inactive
    idx[:, 3] = idx[:, 2]  # a repeated key: two terms
    length = torch.tensor([6, 0, 4, 9, -1, 5, 6, 3], dtype=torch.int32)
    _, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    loss, per_token = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end,
                                      coeff=0.5, return_per_token=True)
    act = sparse_active(idx, length, 12, k_start, k_end)
    want = oracle_kl(q_I, k_I, w, q, kv, lse, idx, act, coeff=0.5)
    torch.testing.assert_close(per_token, want.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(loss, want.sum().detach(), atol=1e-12, rtol=1e-10)
    assert per_token[1] == 0 and per_token[4] == 0  # empty K_t

    got = torch.autograd.grad(loss * 1.7, (q_I, k_I, w))
    ref = torch.autograd.grad(want.sum() * 1.7, (q_I, k_I, w))
    for a, b, name in zip(got, ref, ("q_I", "k_I", "w")):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8, msg=lambda m: "d%s: %s" % (name, m))


@pytest.mark.parametrize("ranges", sorted(RANGES))
def test_dense_loss_and_gradients_match_oracle(ranges):
    q_I, k_I, w, q, kv = make_case(seed=6)
    k_start, k_end = RANGES[ranges]()
    keys, act = dense_keys(8, 12, k_start, k_end)
    lse = attention_lse(q, kv, keys, act)  # the dense attention's LSE over each range
    loss = indexer_kl_loss(q_I, k_I, w, q, kv, lse, k_start=k_start, k_end=k_end, coeff=2.0)
    want = oracle_kl(q_I, k_I, w, q, kv, lse, keys, act, coeff=2.0).sum()
    torch.testing.assert_close(loss, want.detach(), atol=1e-12, rtol=1e-10)
    got = torch.autograd.grad(loss, (q_I, k_I, w))
    ref = torch.autograd.grad(want, (q_I, k_I, w))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_gradcheck_sparse_and_dense():
    q_I, k_I, w, q, kv = make_case(s_q=5, s_kv=7, h_i=2, d_i=4, seed=7)
    k_start, k_end = causal(5, 7)
    idx, length = indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 4, k_start, k_end)
    _, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    for sparse in (True, False):
        def fn(q_I, k_I, w):
            return indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx if sparse else None,
                                   length if sparse else None, k_start, k_end, coeff=0.9)
        assert torch.autograd.gradcheck(fn, (q_I, k_I, w))


def test_no_gradient_into_the_attention_and_loss_alone():
    q_I, k_I, w, q, kv = make_case(seed=8)
    q.requires_grad_()
    kv.requires_grad_()
    idx, length = indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 5)
    out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    loss = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length)
    loss.backward()
    assert q.grad is None and kv.grad is None
    assert q_I.grad is not None and k_I.grad is not None and w.grad is not None
    with torch.no_grad():  # the loss alone: the same value, gradients not computed
        again = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length)
    assert torch.equal(again, loss.detach())


def test_bf16_inputs_fp32_loss():
    q_I, k_I, w, q, kv = make_case(seed=9, dtype=torch.bfloat16)
    idx, length = indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 5)
    _, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    loss = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length)
    assert loss.dtype == torch.float32
    loss.backward()
    assert q_I.grad.dtype == torch.bfloat16 and k_I.grad.dtype == torch.bfloat16
    assert w.grad.dtype == torch.float32
    want = oracle_kl(q_I.double(), k_I.double(), w.double(), q, kv, lse, idx,
                     sparse_active(idx, length, 12)).sum()
    torch.testing.assert_close(loss.double(), want.detach(), atol=1e-6, rtol=1e-5)


# ---- torch.library and torch.compile -------------------------------------------------------------
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def test_opcheck():
    q_I, k_I, w, q, kv = make_case(seed=10)
    k_start, k_end = causal(8, 12)
    plain = (q_I.detach(), k_I.detach(), w.detach())
    torch.library.opcheck(ops.indexer_scores, plain + (k_start, k_end, 0.0),
                          test_utils=OPCHECK_TESTS[:1] + OPCHECK_TESTS[2:3])
    torch.library.opcheck(ops.indexer_topk, plain + (k_start, k_end, 4, 0.0),
                          test_utils=OPCHECK_TESTS[:1] + OPCHECK_TESTS[2:3])
    idx, length = ops.indexer_topk(*plain, k_start, k_end, 4, 0.0)
    _, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
    for sparse in (True, False):
        args = (q_I, k_I, w, q, kv, lse, idx if sparse else None, length if sparse else None,
                k_start, k_end, 0.5, 0.0, 0.0, False, True)
        torch.library.opcheck(ops.indexer_loss, args, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_training_step(backend):
    # Top-k, sparse attention and the indexer loss in one compiled graph, forward and backward.
    q_I, k_I, w, q, kv = make_case(seed=11)
    k_start, k_end = causal(8, 12)

    def step(q_I, k_I, w, q, kv):
        idx, length = indexer_topk(q_I.detach(), k_I.detach(), w.detach(), 5, k_start, k_end)
        out, lse = deepseek_sparse_attention(q, kv, idx, topk_length=length, d_v=8)
        kl = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length, k_start, k_end, coeff=0.3)
        dense = indexer_kl_loss(q_I * 1.5, k_I, w, q, kv, lse, k_start=k_start, k_end=k_end)
        return out.square().mean() + kl + dense

    def grads(fn):
        loss = fn(q_I, k_I, w, q, kv)
        return [loss.detach()] + list(torch.autograd.grad(loss, (q_I, k_I, w)))

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for got, want in zip(grads(compiled), grads(step)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_compile_scores():
    q_I, k_I, w, _, _ = make_case(grad=False, seed=12)
    fn = lambda q_I, k_I, w: indexer_scores(q_I, k_I, w).relu().sum()  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q_I, k_I, w), fn(q_I, k_I, w))


# ---- errors --------------------------------------------------------------------------------------
def test_errors_name_the_argument():
    q_I, k_I, w, q, kv = make_case(grad=False)
    lse = torch.zeros(8, 2)
    with pytest.raises(ValueError, match=r"SA_ERROR_INVALID_ARGUMENT: w: expected shape "
                                         r"\[S_q, H_I\] = \[8, 3\], got \[8, 2\]"):
        indexer_scores(q_I, k_I, w[:, :2])
    with pytest.raises(ValueError, match=r"k_I: expected shape \[S_kv, D_I\] with D_I = 8"):
        indexer_topk(q_I, k_I[:, :4], w, 3)
    with pytest.raises(ValueError, match=r"topk: expected >= 1, got 0"):
        indexer_topk(q_I, k_I, w, 0)
    with pytest.raises(ValueError, match=r"k_end: expected shape \[S_q\] = \[8\], got \[7\]"):
        indexer_topk(q_I, k_I, w, 3, k_end=torch.ones(7, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"q_I: expected rank 3, got rank 2"):
        indexer_scores(q_I[0], k_I, w)
    with pytest.raises(ValueError, match=r"kv: expected shape \[S_kv, D_qk\] = \[12, 16\]"):
        indexer_kl_loss(q_I, k_I, w, q, kv[:5], lse)
    with pytest.raises(ValueError, match=r"lse: expected shape \[S_q, H\] = \[8, 2\]"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse[:, :1])
    with pytest.raises(ValueError, match=r"topk_length: given without topk_idx"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, topk_length=torch.ones(8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"options\.coeff: expected a finite value"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, coeff=float("nan"))



# ---- issue 37's guarantees, as for deepseek_sparse_attention ------------------------------------
INVALID = r"SA_ERROR_INVALID_ARGUMENT: "


def test_wrong_python_types_are_type_errors():
    q_I, k_I, w, q, kv = make_case(grad=False)
    lse = torch.zeros(8, 2)
    with pytest.raises(TypeError, match=r"q_I: expected a torch\.Tensor, got list"):
        indexer_scores([1.0], k_I, w)
    with pytest.raises(TypeError, match=r"k_end: expected a torch\.Tensor or None, got list"):
        indexer_scores(q_I, k_I, w, k_end=[3] * 8)
    with pytest.raises(TypeError, match=r"topk: expected an int, got float 3\.0"):
        indexer_topk(q_I, k_I, w, 3.0)
    with pytest.raises(TypeError, match=r"scale: expected a float or None, got str"):
        indexer_topk(q_I, k_I, w, 3, scale="0.5")
    with pytest.raises(TypeError, match=r"lse: expected a torch\.Tensor, got NoneType"):
        indexer_kl_loss(q_I, k_I, w, q, kv, None)
    with pytest.raises(TypeError, match=r"scale_I: expected a float or None, got Tensor"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, scale_I=torch.tensor(0.5))
    with pytest.raises(TypeError, match=r"coeff: expected a float, got str"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, coeff="1")


@pytest.mark.parametrize("scale", [0.0, -0.0, 1e-50, 1e39, float("nan"), float("inf")])
def test_scales_never_silently_replaced(scale):
    q_I, k_I, w, q, kv = make_case(grad=False)
    lse = torch.zeros(8, 2)
    bounds = r"or a finite value with 1\.1754944e-38 <= \|%s\| <= 2\.35865e\+38"
    with pytest.raises(ValueError, match=INVALID + r"scale: expected None \(the default "
                       r"1/sqrt\(D_I\)\) " + bounds % "scale"):
        indexer_scores(q_I, k_I, w, scale=scale)
    with pytest.raises(ValueError, match=INVALID + r"scale: expected None"):
        indexer_topk(q_I, k_I, w, 3, scale=scale)
    with pytest.raises(ValueError, match=INVALID + r"scale: expected None \(the default "
                       r"1/sqrt\(D_qk\)\)"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, scale=scale)
    with pytest.raises(ValueError, match=INVALID + r"scale_I: expected None \(the default "
                       r"1/sqrt\(D_I\)\) " + bounds % "scale_I"):
        indexer_kl_loss(q_I, k_I, w, q, kv, lse, scale_I=scale)


def test_operator_floats_are_checked_before_fp32():
    q_I, k_I, w, q, kv = make_case(grad=False)
    with pytest.raises(ValueError, match=INVALID + r"options\.scale_I: expected 0 \(for "
                       r"1/sqrt\(D_I\)\) or a finite value"):
        ops.indexer_scores(q_I, k_I, w, None, None, 1e-50)
    with pytest.raises(ValueError, match=INVALID + r"options\.coeff: expected a finite value "
                       r"\(\|coeff\| <= 3\.4028235e\+38 in fp32\), got 1e\+39"):
        indexer_kl_loss(q_I, k_I, w, q, kv, torch.zeros(8, 2), coeff=1e39)


def test_int64_ranges_outside_int32_clamp_like_any_range():
    q_I, k_I, w, q, kv = make_case(grad=False)
    start64 = torch.tensor([-(2**40), -5, 0, 3, 2**33, 4, 1, -(2**63)])
    end64 = torch.tensor([2**40, 12, 2**62, -(2**35), 2**33 + 1, 9, 2**31, 2**63 - 1])
    start32 = start64.clamp(0, 12).int()
    end32 = end64.clamp(0, 12).int()
    torch.testing.assert_close(indexer_scores(q_I, k_I, w, k_start=start64, k_end=end64),
                               indexer_scores(q_I, k_I, w, k_start=start32, k_end=end32),
                               atol=0, rtol=0)
    got = indexer_topk(q_I, k_I, w, 4, start64, end64)
    want = indexer_topk(q_I, k_I, w, 4, start32, end32)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_int64_topk_idx_outside_int32_is_an_inactive_slot():
    q_I, k_I, w, q, kv = make_case(grad=False)
    lse = torch.zeros(8, 2, dtype=torch.float32)
    idx = torch.tensor([[0, 2**32 + 1, 3]] * 8)  # 2^32 + 1 would wrap to key 1
    length = torch.full((8,), 2**40)  # > topk: every slot, as int32 clamping keeps it
    want = indexer_kl_loss(q_I, k_I, w, q, kv, lse, torch.tensor([[0, -1, 3]] * 8).int())
    got = indexer_kl_loss(q_I, k_I, w, q, kv, lse, idx, length)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_shapes_are_validated_before_outputs_are_allocated():
    big = 2**31  # outputs of this size would take terabytes
    q_I = torch.zeros(1, 1, 8, dtype=F64).expand(big, 3, 8)
    k_I = torch.zeros(1, 8, dtype=F64).expand(big, 8)
    with pytest.raises(ValueError, match=INVALID + r"w: expected shape \[S_q, H_I\] = "
                       r"\[2147483648, 3\], got \[8, 3\]"):
        indexer_scores(q_I, k_I, torch.zeros(8, 3, dtype=F64))
    small_q, small_k, w, q, kv = make_case(grad=False)
    with pytest.raises(ValueError, match=INVALID + r"k_end: expected shape \[S_q\] = \[8\]"):
        indexer_topk(small_q, small_k, w, 2**40, k_end=torch.ones(7, dtype=torch.int32))
    q_I = q_I.detach().requires_grad_()  # dq_I would be [2^31, 3, 8] fp64
    with pytest.raises(ValueError, match=INVALID + r"w: expected shape \[S_q, H_I\]"):
        indexer_kl_loss(q_I, k_I, torch.zeros(8, 3, dtype=F64), q, kv, torch.zeros(8, 2))
