"""Issue #37's reproducers, one table row each: every one gives SPEC's result or a clear error
that names the argument. Python API calls run on CPU tensors (the fp64 reference); the CLI rows
run the built `sparse-attention` binary (build/ or SA_CLI) and check its exit status and message.
"""

import ctypes
import math
import subprocess
import types

import pytest
import torch

from conftest import bsa_dense, bsa_token_mask, cli_binary, dsa_dense, needs_cli
from sparse_attention import (_abi, block_sparse_attention, bsa_metadata_from_block_mask,
                              bsa_metadata_from_flex_block_mask, deepseek_sparse_attention)

f64 = torch.float64
INVALID = r"SA_ERROR_INVALID_ARGUMENT: "
METADATA = r"SA_ERROR_INVALID_METADATA: "


def bsa_inputs(b=1, h=2, s=128, d=8, dtype=f64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=dtype) for _ in range(3))
    idx = torch.tensor([0, 1], dtype=torch.int32).expand(b, h, 2, 2).contiguous()
    return q, k, v, idx


def dsa_inputs(s_q=1, s_kv=8, h=1, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(s_q, h, d, generator=g, dtype=f64),
            torch.randn(s_kv, d, generator=g, dtype=f64))


# ---- 3. DSA int64 indices and lengths outside int32 ---------------------------------------------
def test_3_dsa_index_outside_int32_is_an_inactive_slot():
    q, kv = dsa_inputs()
    out, lse = deepseek_sparse_attention(q, kv, torch.tensor([[2**32 + 5]]), d_v=8)
    assert torch.equal(out, torch.zeros_like(out)) and lse.item() == math.inf  # empty row
    for bad in (2**31, -(2**31) - 1, 2**62, -(2**63), 2**63 - 1):
        idx = torch.tensor([[bad, 5]])
        out, lse = deepseek_sparse_attention(q, kv, idx, d_v=8)
        want, want_lse = dsa_dense(q, kv, torch.tensor([[-1, 5]]), d_v=8)
        torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("length, empty", [(2**32, False), (-(2**32) + 2, True), (2**62, False),
                                           (-(2**63), True), (2**31, False)])
def test_3_dsa_topk_length_outside_int32_keeps_its_meaning(length, empty):
    q, kv = dsa_inputs()
    out, lse = deepseek_sparse_attention(q, kv, torch.tensor([[5]]), d_v=8,
                                         topk_length=torch.tensor([length]))
    if empty:  # <= 0: an empty row
        assert torch.equal(out, torch.zeros_like(out)) and lse.item() == math.inf
    else:  # > topk: read as topk
        torch.testing.assert_close(out[0, 0], kv[5, :8], atol=1e-12, rtol=0)


# ---- 4. BSA int64 metadata outside int32 --------------------------------------------------------
@pytest.mark.parametrize("which, value, pattern", [
    ("q2k_index", 2**32, r"sparsity\.q2k_index\[b=0, h=0, m=0, slot=0\] = 4294967296: outside"),
    ("q2k_count", 2**32 + 1, r"sparsity\.q2k_count\[b=0, h=0, m=0\] = 4294967297: outside"),
    ("kv_block_len", 2**32 + 64, r"sparsity\.kv_block_len\[n=1\] = 4294967360: outside"),
    ("q2k_index", -(2**31) - 1, r"sparsity\.q2k_index\[b=0, h=0, m=0, slot=0\] = -2147483649"),
])
def test_4_bsa_metadata_outside_int32_is_a_named_error(which, value, pattern):
    q, k, v, idx = bsa_inputs()
    idx = idx.long()
    count = torch.full((1, 2, 2), 2, dtype=torch.int64)
    blen = torch.tensor([64, 64], dtype=torch.int64)
    if which == "q2k_index":
        idx[0, 0, 0, 0] = value
    elif which == "q2k_count":
        count[0, 0, 0] = value
    else:
        blen[1] = value
    with pytest.raises(ValueError, match=METADATA + pattern):
        block_sparse_attention(q, k, v, idx, count, kv_block_len=blen, block_size=64)


# ---- 5. Python ints into int32 fields -----------------------------------------------------------
@pytest.mark.parametrize("kwargs, pattern", [
    ({"block_size": 2**32 + 64},
     r"options\.block_size: expected 64 or 128, got 4294967360 \(outside int32\)"),
    ({"count": 2**32 + 1},
     r"options\.count: expected -1 \(K_max\) or a value in \[0, K_max\], got 4294967297"),
    ({"bucket_size": 2**32 - 1},
     r"options\.bucket_size: expected >= 0 \(0 = automatic\), got 4294967295"),
    ({"block_size": 2**31}, r"options\.block_size: expected 64 or 128, got 2147483648"),
])
def test_5_bsa_options_outside_int32(kwargs, pattern):
    q, k, v, idx = bsa_inputs()
    kwargs.setdefault("block_size", 64)
    with pytest.raises(ValueError, match=INVALID + pattern):
        block_sparse_attention(q, k, v, idx, **kwargs)


def test_5_dsa_d_v_outside_int32():
    q, kv = dsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"options\.d_v: expected .*got 4294967304"):
        deepseek_sparse_attention(q, kv, torch.tensor([[5]]), d_v=2**32 + 8)


# ---- 6. K_max past int32 ------------------------------------------------------------------------
@pytest.mark.parametrize("k_max", [2**31 + 1, 2**32 + 1])
def test_6_kmax_past_int32(k_max):
    q, k, v, _ = bsa_inputs()
    wide = torch.zeros(1, 1, 1, 1, dtype=torch.int32).expand(1, 2, 2, k_max)
    with pytest.raises(ValueError, match=INVALID + r"sparsity\.q2k_index: K_max = %d entries per "
                       r"row \(options\.count = -1 reads them all\) exceeds" % k_max):
        block_sparse_attention(q, k, v, wide, block_size=64)
    # With q2k_count the row's length is given: any K_max is fine.
    count = torch.ones(1, 2, 2, dtype=torch.int32)
    o, lse = block_sparse_attention(q, k, v, wide, count, block_size=64)
    o1, lse1 = block_sparse_attention(q, k, v, wide[..., :1].contiguous(), count, block_size=64)
    assert torch.equal(o, o1) and torch.equal(lse, lse1)


# ---- 7. scale -----------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.0, -0.0, 1e-50, -1e-40, 1e39, -1e39, math.nan, math.inf])
def test_7_scale_never_silently_replaced(scale):
    q, k, v, idx = bsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"scale: expected None \(the default "
                       r"1/sqrt\(D\)\) or a finite value with 1\.1754944e-38 <= \|scale\| <= "
                       r"2\.35865e\+38"):
        block_sparse_attention(q, k, v, idx, block_size=64, scale=scale)
    qd, kv = dsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"scale: expected None \(the default "
                       r"1/sqrt\(D_qk\)\)"):
        deepseek_sparse_attention(qd, kv, torch.tensor([[5]]), d_v=8, scale=scale)


@pytest.mark.parametrize("scale", [-0.5, 2.0**-100, 1e30])
def test_7_any_other_scale_is_the_scale(scale):
    q, k, v, idx = bsa_inputs()
    o, lse = block_sparse_attention(q, k, v, idx, block_size=64, scale=scale)
    tok = bsa_token_mask(idx, None, None, 64, 128, 128)
    o_ref, lse_ref = bsa_dense(q, k, v, tok, scale=scale)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)


def test_7_scale_types():
    q, k, v, idx = bsa_inputs()
    for bad in ("0.5", torch.tensor(0.5), True):
        with pytest.raises(TypeError, match=r"scale: expected a float or None"):
            block_sparse_attention(q, k, v, idx, block_size=64, scale=bad)


# ---- 8. huge scales: no NaN in the backward -----------------------------------------------------
@pytest.mark.parametrize("dtype", [f64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e30, -1e30, 2.3e38])
def test_8_huge_scale_backward_has_no_nan(dtype, scale):
    q, k, v, idx = bsa_inputs(dtype=dtype, d=16)
    for t in (q, k, v):
        t.requires_grad_()
    o, lse = block_sparse_attention(q, k, v, idx, block_size=64, scale=scale)
    o.float().square().sum().backward()
    for name, t in (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert not torch.isnan(t).any(), "%s holds NaN at scale %g" % (name, scale)
    qd, kv = dsa_inputs(s_q=3, h=2)
    qd.requires_grad_()
    kv.requires_grad_()
    sink = torch.zeros(2, requires_grad=True)
    out, _ = deepseek_sparse_attention(qd, kv, torch.tensor([[1, 5], [2, 2], [0, 7]]), d_v=8,
                                       sink=sink, scale=scale)
    out.sum().backward()
    for t in (out, qd.grad, kv.grad, sink.grad):
        assert not torch.isnan(t).any()


# ---- 9. every error names the argument ----------------------------------------------------------
@pytest.mark.parametrize("which, dtype", [
    (w, d) for w in ("q", "k", "q2k_index")
    for d in (torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn)
    if (w, d) != ("q2k_index", torch.int64)  # int64 metadata is converted, its values checked
])
def test_9_unsupported_dtypes_name_the_argument(which, dtype):
    q, k, v, idx = bsa_inputs()
    args = {"q": q, "k": k, "q2k_index": idx}
    args[which] = args[which].to(dtype)
    name = "sparsity.q2k_index" if which == "q2k_index" else which
    with pytest.raises(ValueError, match=INVALID + r"%s: unsupported dtype %s" % (
            name.replace(".", r"\."), str(dtype).replace(".", r"\."))):
        block_sparse_attention(args["q"], args["k"], v, args["q2k_index"], block_size=64)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.float8_e4m3fn])
def test_9_topk_length_dtype_names_the_argument(dtype):
    q, kv = dsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"topk_length: unsupported dtype"):
        deepseek_sparse_attention(q, kv, torch.tensor([[5]]), d_v=8,
                                  topk_length=torch.tensor([1]).to(dtype))


def test_9_rank5_names_the_argument():
    q, k, v, idx = bsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"q: expected rank <= 4 \(the library's "
                       r"tensors\), got rank 5"):
        block_sparse_attention(q[None], k, v, idx, block_size=64)
    with pytest.raises(ValueError, match=INVALID + r"sparsity\.q2k_count: expected rank <= 4"):
        block_sparse_attention(q, k, v, idx, torch.zeros(1, 1, 1, 2, 2, dtype=torch.int32),
                               block_size=64)


def test_9_broadcast_mismatch_is_the_library_shape_error():
    q, k, v, _ = bsa_inputs(h=4)
    with pytest.raises(ValueError, match=INVALID + r"sparsity\.q2k_index: expected shape "
                       r"\[B, H_q, N_q, K_max\] = \[1, 4, 2, K_max\].*got \[1, 3, 2, 1\]"):
        block_sparse_attention(q, k, v, torch.zeros(1, 3, 2, 1, dtype=torch.int32), block_size=64)
    with pytest.raises(ValueError, match=INVALID + r"sparsity\.q2k_count: expected shape"):
        block_sparse_attention(q, k, v, torch.zeros(1, 1, 2, 1, dtype=torch.int32),
                               torch.zeros(2, 1, 2, dtype=torch.int32), block_size=64)


def test_9_wrong_python_types_are_type_errors():
    q, k, v, idx = bsa_inputs()
    with pytest.raises(TypeError, match=r"layout: expected 'bhsd' or 'bshd' \(a str\), got list"):
        block_sparse_attention(q, k, v, idx, layout=["bhsd"], block_size=64)
    with pytest.raises(TypeError, match=r"block_size: expected an int, got float 64\.0"):
        block_sparse_attention(q, k, v, idx, block_size=64.0)
    with pytest.raises(TypeError, match=r"count: expected an int or None, got float"):
        block_sparse_attention(q, k, v, idx, block_size=64, count=1.5)
    with pytest.raises(TypeError, match=r"k: expected a torch\.Tensor, got list"):
        block_sparse_attention(q, [1, 2], v, idx, block_size=64)
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"k_max: expected an int or None, got float 2\.5"):
        bsa_metadata_from_block_mask(mask, k_max=2.5)
    with pytest.raises(TypeError, match=r"block_mask: expected a FlexAttention BlockMask .*got "
                       r"Tensor; for a boolean \[B, H, N_q, N_kv\] block mask use "
                       r"bsa_metadata_from_block_mask"):
        bsa_metadata_from_flex_block_mask(mask)
    block_mask = types.SimpleNamespace(BLOCK_SIZE=(64, 64), kv_indices=idx, kv_num_blocks=None)
    with pytest.raises(TypeError, match=r"block_mask: expected a \[B, H, N_q, N_kv\] boolean "
                       r"torch\.Tensor, got SimpleNamespace; for a FlexAttention BlockMask use "
                       r"bsa_metadata_from_flex_block_mask"):
        bsa_metadata_from_block_mask(block_mask)
    with pytest.raises(TypeError, match=r"q2k_index: expected a torch\.Tensor, got "
                       r"SimpleNamespace; convert a FlexAttention BlockMask with "
                       r"bsa_metadata_from_flex_block_mask"):
        block_sparse_attention(q, k, v, block_mask, block_size=64)
    qd, kv = dsa_inputs()
    with pytest.raises(TypeError, match=r"d_v: expected an int or None, got float 8\.0"):
        deepseek_sparse_attention(qd, kv, torch.tensor([[5]]), d_v=8.0)


def test_9_bshd_without_layout_names_the_likely_cause():
    q = torch.randn(1, 256, 2, 8, dtype=f64)  # [B, S, H, D]
    idx = torch.zeros(1, 2, 4, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"sparsity\.q2k_index: expected shape .*; read in layout "
                       r"BSHD \(options\.layout\), q's shape \[1, 256, 2, 8\] would match: is the "
                       r"layout right\?"):
        block_sparse_attention(q, q, q, idx, block_size=64)
    block_sparse_attention(q, q, q, idx, block_size=64, layout="bshd")  # and with it, it runs


# ---- 10. shapes are validated before anything is allocated --------------------------------------
def test_10_no_allocation_before_validation():
    q = torch.zeros(1, 1, 1, 64, dtype=f64).expand(1, 1, 2**31, 64)  # 1 TiB if materialised
    with pytest.raises(ValueError, match=INVALID + r"sparsity\.q2k_index: expected shape "
                       r"\[B, H_q, N_q, K_max\] = \[1, 1, 16777216, K_max\]"):
        block_sparse_attention(q, q, q, torch.zeros(1, 1, 3, 1, dtype=torch.int32),
                               block_size=128)
    qd, kv = dsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"options\.d_v: expected a value in "
                       r"\[1, D_qk = 16\], got -5"):
        deepseek_sparse_attention(qd, kv, torch.tensor([[5]]), d_v=-5)


def test_10_backward_shapes_checked_before_allocation():
    import sparse_attention._ops as ops

    q, k, v, idx = bsa_inputs()
    o, lse = block_sparse_attention(q, k, v, idx, block_size=64)
    huge = torch.zeros(1, 1, 1, 8, dtype=f64).expand(2**20, 2, 128, 8)  # dq: 17 GB
    with pytest.raises(ValueError, match=INVALID + r"k: batch must equal q's batch"):
        ops.bsa_bwd(o, huge, k, v, o, lse, idx, None, None, 64, 0, -1, 0.0, 0, False, False)


# ---- 11. minor ----------------------------------------------------------------------------------
def test_11_c_abi_rejects_an_element_count_past_int64():
    q, k, v, idx = bsa_inputs()
    o, lse = torch.empty_like(q), torch.empty(1, 2, 128)
    args = _abi.sa_bsa_fwd_args()
    import sparse_attention._ops as ops

    args = ops._bsa_fwd_args(q, k, v, idx, None, None, o, lse,
                             ops._bsa_options(64, 0, -1, 0.0, 0, False, False), False)
    shape = (ctypes.c_int64 * 4)(2**62, 2, 128, 8)
    lib = _abi.LIB
    lib.sa_tensor_contiguous.restype = _abi.sa_tensor
    lib.sa_tensor_contiguous.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int32,
                                         ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                         ctypes.c_int32]
    args.q = lib.sa_tensor_contiguous(q.data_ptr(), 3, 4, shape, 0, 0)
    assert lib.sa_bsa_forward(ctypes.byref(args), None) == _abi.SA_ERROR_INVALID_ARGUMENT
    assert lib.sa_last_error().decode().startswith(
        "q: shape [4611686018427387904, 2, 128, 8] holds more than 2^63 - 1 elements")


def test_11_meta_and_cpu_inputs_are_an_error():
    q, k, v, idx = bsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"k: expected device meta like q, got cpu"):
        block_sparse_attention(q.to("meta"), k, v, idx, block_size=64)
    qd, kv = dsa_inputs()
    with pytest.raises(ValueError, match=INVALID + r"topk_idx: expected device meta like q, "
                       r"got cpu"):
        deepseek_sparse_attention(qd.to("meta"), kv.to("meta"), torch.tensor([[5]]), d_v=8)
    out, lse = deepseek_sparse_attention(qd.to("meta"), kv.to("meta"),
                                         torch.tensor([[5]], device="meta"), d_v=8)
    assert out.device.type == "meta" and out.shape == (1, 1, 8)


def test_11_k_max_above_n_kv_gives_width_k_max():
    mask = torch.tensor([[[[True, False], [True, True]]]])
    index, count = bsa_metadata_from_block_mask(mask, k_max=5)
    assert index.shape == (1, 1, 2, 5) and count.tolist() == [[[1, 2]]]
    assert index[0, 0, 0, :1].tolist() == [0] and index[0, 0, :, 2:].eq(-1).all()
    q, k, v, _ = bsa_inputs(h=1)
    o, _ = block_sparse_attention(q, k, v, index, count, block_size=64)
    o2, _ = block_sparse_attention(q, k, v, *bsa_metadata_from_block_mask(mask), block_size=64)
    assert torch.equal(o, o2)


def test_11_nan_sink_propagates_to_its_head_only():
    qd, kv = dsa_inputs(s_q=3, h=2)
    idx = torch.tensor([[5, 6], [-1, -1], [1, 2]])  # row 1 is empty
    out, lse = deepseek_sparse_attention(qd, kv, idx, d_v=8, sink=torch.tensor([math.nan, 0.0]))
    assert torch.isnan(out[[0, 2], 0]).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # empty rows stay 0
    assert torch.isfinite(out[:, 1]).all()
    assert torch.isfinite(lse[[0, 2]]).all() and torch.isinf(lse[1]).all()  # sink excluded


# ---- 1 and 2: the command-line tool -------------------------------------------------------------
def run_cli(*args):
    r = subprocess.run([cli_binary(), "demo"] + list(args), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode >= 0, "killed by signal %d: %s" % (-r.returncode, r.stderr)
    return r


@needs_cli
@pytest.mark.parametrize("value", ["4294967296", "4294967360", "2147483648", "0", "-64"])
def test_1_cli_block_outside_int32(value):
    r = run_cli("--device", "cpu", "--block", value)
    assert r.returncode == 2
    assert "error: --block: expected a positive integer <= 2147483647, got '%s'" % value in r.stderr


@needs_cli
@pytest.mark.parametrize("args, flags, tensor", [
    (["--batch", "1152921504606846977", "--heads", "1", "--kv-heads", "1", "--density", "0.25",
      "--op", "bsa_fwd"], "--batch, --heads", "q [1152921504606846977, 1, 256, 64]"),
    (["--batch", "1152921504606846977", "--heads", "1", "--kv-heads", "1", "--density", "0.25",
      "--op", "bsa_bwd"], "--batch, --heads", "q [1152921504606846977, 1, 256, 64]"),
    (["--batch", "4611686018427387905", "--heads", "1", "--kv-heads", "1", "--op", "bsa_fwd"],
     "--batch, --heads", "q [4611686018427387905, 1, 256, 64]"),
    (["--dsa-queries", "4611686018427387905", "--dsa-heads", "1", "--dsa-dqk", "512", "--topk",
      "4", "--op", "dsa_fwd"], "--dsa-queries, --dsa-seq", "q [4611686018427387905, 1, 512]"),
])
def test_2_cli_shape_products_overflow(args, flags, tensor):
    r = run_cli("--device", "cpu", *args)
    assert r.returncode == 2, r.stderr
    assert flags in r.stderr and tensor + " holds more than 2^63 - 1 bytes" in r.stderr


@needs_cli
def test_2_cli_problem_larger_than_memory():
    r = run_cli("--device", "cpu", "--batch", "1000000", "--op", "bsa_fwd")
    assert r.returncode == 2
    assert "bytes of host memory, more than this machine's" in r.stderr


def test_4_int64_padding_past_the_count_is_never_read():
    q, k, v, idx = bsa_inputs()
    wide = torch.full((1, 2, 2, 3), -(2**63), dtype=torch.int64)
    wide[..., :2] = idx
    count = torch.tensor([[[2, 1], [0, 2]]])
    o, lse = block_sparse_attention(q, k, v, wide, count, block_size=64)
    o2, lse2 = block_sparse_attention(q, k, v, wide[..., :2].clamp(min=0), count, block_size=64)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    o3, _ = block_sparse_attention(q, k, v, wide, block_size=64, count=2)
    o4, _ = block_sparse_attention(q, k, v, idx, block_size=64)
    assert torch.equal(o3, o4)
    with pytest.raises(ValueError, match=METADATA + r"sparsity\.q2k_index\[b=0, h=0, m=0, "
                       r"slot=2\] = -9223372036854775808: outside"):
        block_sparse_attention(q, k, v, wide, block_size=64)  # count -1 reads all 3
