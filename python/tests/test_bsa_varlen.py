"""BSA packed (variable-length, THD) batches (SPEC 4) through the package on the CPU: values and
gradients of one packed call against a separate call per sequence (the dense-batch API, BSHD),
with and without masks; the argument errors; torch.compile-style meta tracing. On CUDA (skipped
without a GPU): the forward and backward under AUTO against the reference."""

import pytest
import torch

from sparse_attention import block_sparse_attention

CUDA = torch.cuda.is_available()


def make_case(seqs_q, seqs_kv, h_q, h_kv, d, block, seed, device="cpu", dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    t_q, t_kv = sum(seqs_q), sum(seqs_kv)
    n_q = max([1] + [-(-s // block) for s in seqs_q])
    k_max = max([1] + [-(-s // block) for s in seqs_kv])
    index = torch.full((len(seqs_q), h_q, n_q, k_max), -1, dtype=torch.int32)
    count = torch.zeros(len(seqs_q), h_q, n_q, dtype=torch.int32)
    for b, (sq, skv) in enumerate(zip(seqs_q, seqs_kv)):
        nkv = -(-skv // block)
        for h in range(h_q):
            for m in range(-(-sq // block)):
                pick = torch.randperm(nkv, generator=g)[: int(torch.randint(0, nkv + 1, (1,),
                                                                            generator=g))]
                if torch.rand(1, generator=g) < 0.6:
                    pick = torch.randperm(nkv, generator=g)  # mostly every block: masks matter
                index[b, h, m, : len(pick)] = pick.to(torch.int32)
                count[b, h, m] = len(pick)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)

    q, k, v = rnd(t_q, h_q, d), rnd(t_kv, h_kv, d), rnd(t_kv, h_kv, d)
    dout = rnd(t_q, h_q, d)
    cu_q = torch.tensor([0] + list(torch.tensor(seqs_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(seqs_kv).cumsum(0)), dtype=torch.int32)
    return q, k, v, dout, index.to(device), count.to(device), cu_q.to(device), cu_k.to(device)


def packed_and_per_sequence(seqs_q, seqs_kv, h_q, h_kv, d, block, seed, **mask_kwargs):
    q, k, v, dout, index, count, cu_q, cu_k = make_case(seqs_q, seqs_kv, h_q, h_kv, d, block,
                                                        seed)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = block_sparse_attention(*leaves, index, count, block_size=block, cu_seqlens_q=cu_q,
                                    cu_seqlens_k=cu_k, **mask_kwargs)
    assert o.shape == (q.shape[0], h_q, d) and lse.shape == (h_q, q.shape[0])
    o.backward(dout)
    grads = [t.grad for t in leaves]
    for b, (sq, skv) in enumerate(zip(seqs_q, seqs_kv)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if sq == 0:
            continue
        if skv == 0:  # no keys: o = 0, lse = -inf
            assert torch.equal(o[q0:q0 + sq], torch.zeros_like(o[q0:q0 + sq]))
            assert torch.isneginf(lse[:, q0:q0 + sq]).all()
            assert torch.equal(grads[0][q0:q0 + sq], torch.zeros_like(grads[0][q0:q0 + sq]))
            continue
        one = [t[None, s0:s0 + n].clone().requires_grad_()
               for t, s0, n in ((q, q0, sq), (k, k0, skv), (v, k0, skv))]
        nq = -(-sq // block)
        o1, lse1 = block_sparse_attention(*one, index[b:b + 1, :, :nq], count[b:b + 1, :, :nq],
                                          block_size=block, layout="bshd", **mask_kwargs)
        o1.backward(dout[None, q0:q0 + sq])
        torch.testing.assert_close(o[q0:q0 + sq], o1[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, q0:q0 + sq], lse1[0], rtol=0, atol=0)
        torch.testing.assert_close(grads[0][q0:q0 + sq], one[0].grad[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grads[1][k0:k0 + skv], one[1].grad[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grads[2][k0:k0 + skv], one[2].grad[0], rtol=1e-12, atol=1e-12)
    for b, (sq, skv) in enumerate(zip(seqs_q, seqs_kv)):
        if sq == 0:  # keys nobody queries: exact zeros
            k0 = int(cu_k[b])
            assert not grads[1][k0:k0 + skv].any() and not grads[2][k0:k0 + skv].any()


CASES = {
    # empty sequences, one token, shorter than a block, exact blocks, partial last blocks
    "mixed": ([100, 0, 1, 64, 130, 7], [100, 0, 1, 64, 130, 7]),
    # S_q != S_kv per sequence, queries without keys, keys without queries
    "sq_ne_skv": ([70, 5, 128, 9, 0], [200, 64, 3, 0, 40]),
}
MASKS = {
    "nomask": {},
    "causal": {"mask": "causal"},
    "window": {"mask": "window", "window_left": 40, "window_right": 10},
    "causal_window_offset0": {"mask": "causal_window", "window_left": 50, "causal_offset": 0},
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_packed_matches_per_sequence(case, mask, heads):
    seqs_q, seqs_kv = CASES[case]
    packed_and_per_sequence(seqs_q, seqs_kv, heads[0], heads[1], 16, 64, seed=hash(case) % 1000,
                            **MASKS[mask])


def test_packed_block_128_and_int64_offsets():
    q, k, v, dout, index, count, cu_q, cu_k = make_case([300, 17], [129, 256], 2, 1, 8, 128, 5)
    o, lse = block_sparse_attention(q, k, v, index, count, block_size=128, mask="causal",
                                    cu_seqlens_q=cu_q.long(), cu_seqlens_k=cu_k.long())
    o2, lse2 = block_sparse_attention(q, k, v, index, count, block_size=128, mask="causal",
                                      cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_packed_argument_errors():
    q, k, v, dout, index, count, cu_q, cu_k = make_case([70, 0, 60], [50, 10, 64], 2, 1, 16, 64, 1)
    with pytest.raises(ValueError, match="options.cu_seqlens_k: absent while"):
        block_sparse_attention(q, k, v, index, count, block_size=64, cu_seqlens_q=cu_q)
    with pytest.raises(ValueError, match=r"q: expected rank 3 \[T, H, D\]"):
        block_sparse_attention(q[None], k, v, index, count, block_size=64, cu_seqlens_q=cu_q,
                               cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="options.cu_seqlens_k: expected shape"):
        block_sparse_attention(q, k, v, index, count, block_size=64, cu_seqlens_q=cu_q,
                               cu_seqlens_k=cu_k[:-1])
    bad = cu_q.clone()
    bad[3] = 129
    with pytest.raises(ValueError, match=r"options.cu_seqlens_q\[3\] = 129: expected T_q"):
        block_sparse_attention(q, k, v, index, count, block_size=64, cu_seqlens_q=bad,
                               cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="sparsity.kv_block_len: not taken with packed batches"):
        block_sparse_attention(q, k, v, index, count, block_size=64, cu_seqlens_q=cu_q,
                               cu_seqlens_k=cu_k,
                               kv_block_len=torch.full((2,), 64, dtype=torch.int32))


def test_packed_meta_tensors_validate_shapes():
    q, k, v, dout, index, count, cu_q, cu_k = make_case([70, 60], [50, 64], 2, 1, 16, 64, 2)
    meta = [t.to("meta") for t in (q, k, v, index, count, cu_q, cu_k)]
    o, lse = block_sparse_attention(*meta[:5], block_size=64, mask="causal",
                                    cu_seqlens_q=meta[5], cu_seqlens_k=meta[6])
    assert o.shape == (130, 2, 16) and lse.shape == (2, 130) and o.device.type == "meta"
    with pytest.raises(ValueError, match="options.cu_seqlens_k: expected shape"):
        block_sparse_attention(*meta[:5], block_size=64, cu_seqlens_q=meta[5],
                               cu_seqlens_k=meta[6][:-1])


# ---- CUDA (skipped without a GPU): the portable forward and backward under AUTO ----------------
cuda_only = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def _rel_l2(got, want):
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@cuda_only
def test_cuda_packed_forward_matches_the_reference():
    case = make_case([70, 60], [50, 64], 2, 1, 64, 64, 3)
    q, k, v, dout, index, count, cu_q, cu_k = case
    want_o, want_lse = block_sparse_attention(q, k, v, index, count, block_size=64,
                                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    dev = [t.to("cuda", torch.bfloat16) for t in (q, k, v)]
    meta = [t.to("cuda") for t in (index, count, cu_q, cu_k)]
    with torch.no_grad():
        o, lse = block_sparse_attention(*dev, meta[0], meta[1], block_size=64,
                                        cu_seqlens_q=meta[2], cu_seqlens_k=meta[3])
    # The reference ran on the float64 inputs; the kernel on their bf16 roundings.
    assert torch.allclose(o.double().cpu(), want_o.double(), atol=3e-2, rtol=3e-2)
    assert torch.allclose(lse.double().cpu(), want_lse.double(), atol=3e-2, rtol=1e-2)


# Empty and one-token sequences, queries without keys, keys without queries; GQA; with and
# without a mask; block 64 and 128 (D 64 and 128: the portable kernels' head dims).
CUDA_CASES = {
    "mixed_b64_d64": ([70, 0, 1, 130, 9], [50, 3, 1, 130, 0], 4, 2, 64, 64),
    "mixed_b128_d128": ([200, 1, 0, 129], [129, 1, 40, 300], 2, 2, 128, 128),
}


@cuda_only
@pytest.mark.parametrize("case", list(CUDA_CASES), ids=list(CUDA_CASES))
@pytest.mark.parametrize("mask", ["nomask", "causal", "window"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_cuda_packed_backward_matches_the_reference(case, mask, deterministic):
    seqs_q, seqs_kv, h_q, h_kv, d, block = CUDA_CASES[case]
    q, k, v, dout, index, count, cu_q, cu_k = make_case(seqs_q, seqs_kv, h_q, h_kv, d, block, 11)
    # The reference on the bf16 roundings of the inputs, so that only the kernel's rounding counts.
    q, k, v, dout = (t.to(torch.bfloat16).double() for t in (q, k, v, dout))
    kwargs = dict(MASKS[mask], block_size=block)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_o, want_lse = block_sparse_attention(*leaves, index, count, cu_seqlens_q=cu_q,
                                              cu_seqlens_k=cu_k, **kwargs)
    want_o.backward(dout)
    want = [t.grad for t in leaves]

    meta = [t.to("cuda") for t in (index, count, cu_q, cu_k)]
    dev = [t.to("cuda", torch.bfloat16).requires_grad_() for t in (q, k, v)]
    o, _ = block_sparse_attention(*dev, meta[0], meta[1], cu_seqlens_q=meta[2],
                                  cu_seqlens_k=meta[3], deterministic=deterministic, **kwargs)
    o.backward(dout.to("cuda", torch.bfloat16))
    # dS cancels to exactly 0 in float64 where a row sees one key: dq, dk against at least 1e-3
    # of dv's norm (as the C++ suite does).
    floor = 1e-3 * float(want[2].norm())
    # Exact zeros: dq of rows without keys (lse -inf), dk and dv of keys nobody attends (the
    # reference's dv row is 0).
    no_key = torch.isneginf(want_lse.detach()).t()  # [T_q, H_q]
    unattended = (want[2] == 0).all(dim=-1)         # [T_kv, H_kv]
    for name, got, ref, zero in zip(("dq", "dk", "dv"), (t.grad for t in dev), want,
                                    (no_key, unattended, unattended)):
        got = got.cpu()
        assert not got.isnan().any(), name
        err = float((got.double() - ref).norm()) / max(float(ref.norm()), floor, 1e-30)
        assert err < 1e-2, (name, err)
        assert torch.equal(got[zero], torch.zeros_like(got[zero])), name
