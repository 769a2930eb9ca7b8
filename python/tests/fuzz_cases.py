"""The fuzz suite's cases: Hypothesis strategies that draw a call (shapes, dtypes, strides,
metadata values, scalar options, at most one deliberate fault), and runners that make the call and
check it against the independent fp64 oracle (fuzz_oracle.py) or against the error it must raise.

A case is a plain JSON-able dict, so a worker can log it before running it and a crash names it:
`python fuzz_worker.py --replay '<case json>'` runs one case again.

Kinds:
  api  the Python API (block_sparse_attention / deepseek_sparse_attention, forward and backward
       through autograd) on CPU tensors (the fp64 reference) or, with device "cuda", on the GPU;
  abi  the C ABI through ctypes: a valid call, then at most one field of the argument structs set
       to an adversarial raw value (rank, dtype and device enums, shapes, strides, NULL data,
       option values); a bad field must give SA_ERROR_INVALID_ARGUMENT (or UNSUPPORTED) with a
       message that starts with the argument's name, and leave the outputs untouched.
"""

import ctypes
import math
import os
import random
import re

import torch
from hypothesis import strategies as st

import fuzz_oracle as oracle
from sparse_attention import _abi, _ops, block_sparse_attention, deepseek_sparse_attention

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}
# Relative spacing of each dtype (one unit in the last place, at worst) and the spacing of its
# subnormals: two correctly rounded results of the same exact value differ by at most that much.
ULP = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7,
       torch.float16: 2.0**-10}
TINY = {torch.float64: 5e-324, torch.float32: 1.5e-45, torch.bfloat16: 1e-40, torch.float16: 6e-8}
BAD_SCALES = [0.0, -0.0, 1e-50, -1e-45, 1e39, -1e39, float("nan"), float("inf"), float("-inf")]
# Huge scales on CUDA tensors: the GPU backward kernels recompute P = exp2(s - lse) without the
# reference's cap at 1, so the fp32 LSE's rounding can overflow it (issue #37, item 8); drawn
# on the GPU only with SA_FUZZ_GPU_HUGE_SCALES=1 until the kernels cap it.
GPU_HUGE_SCALES = os.environ.get("SA_FUZZ_GPU_HUGE_SCALES") == "1"


class CaseFailure(AssertionError):
    pass


def _fail(case, what):
    raise CaseFailure("%s\n  case: %r" % (what, case))


# ---- comparisons --------------------------------------------------------------------------------
def _conditioned(lse_mag) -> bool:
    """Whether a GPU result's values can be compared with the fp64 oracle's. The GPU paths form
    scores in fp32: a score is exact to about 1e-6 of its terms' magnitude |scale| sum |q_i k_i|
    (lse_mag), and the backward's probabilities come from the stored fp32 LSE. Past a magnitude
    of 1e5 a score moves by 0.1 or more and the softmax among near-tied keys follows the rounded
    scores (docs/conventions.md, "Numerics"): then only NaN and inf placement and the bound
    |out| <= max |v| (the probability cap) are checked, and the LSE relative to that
    magnitude."""
    return float(lse_mag.max()) < 1e5 if lse_mag.numel() else True


def _check_bounded(case, name, got, v):
    """got's finite values within the largest |v| (a convex combination of rows of v), with one
    unit of bf16 of room."""
    got = got.detach().to("cpu", torch.float64)
    v = v[torch.isfinite(v)]  # unread rows may hold NaN (nan_unread)
    vmax = float(v.abs().max()) if v.numel() else 0.0
    fin = torch.isfinite(got)
    if fin.any() and float(got[fin].abs().max()) > vmax * (1 + 2.0 ** -7) + 1e-30:
        _fail(case, "%s: |value| %.4g above max |v| %.4g"
              % (name, float(got[fin].abs().max()), vmax))


def _compare_forward(case, name, got, want, mag, lse_mag, v, dtype, device):
    """A forward's output against the oracle's: value by value where the GPU's fp32 scores can
    resolve the softmax (_conditioned), else its NaN placement and its bound by max |v|."""
    values = device != "cuda" or _conditioned(lse_mag)
    _compare(case, name, got, want, mag, dtype, device, values=values)
    if not values:
        _check_bounded(case, name, got, v)


def _compare(case, name, got, want, mag, dtype, device, lse=False, values=True):
    """got (the library's output) against the oracle's exact value `want`, rounded to the output
    dtype. CPU (the fp64 reference): every element within one unit of that dtype plus 1e-9 of the
    element's magnitude sum. CUDA: SPEC section 3's relative L2 bound, NaN and inf in place.
    values=False: only that got has NaN exactly where the oracle has."""
    got = got.detach().to("cpu", torch.float64)
    if not values:
        gn, wn = torch.isnan(got), torch.isnan(want)
        if not torch.equal(gn, wn):
            i = tuple(int(x) for x in (gn ^ wn).nonzero()[0])
            _fail(case, "%s: NaN at %s differs (got %r, expected %r)"
                  % (name, i, float(got[i]), float(want[i])))
        return
    want_r = want.to(dtype).to(torch.float64)
    if got.shape != want.shape:
        _fail(case, "%s: shape %s, expected %s" % (name, tuple(got.shape), tuple(want.shape)))
    gn, wn = torch.isnan(got), torch.isnan(want_r)
    if not torch.equal(gn, wn):
        i = tuple(int(x) for x in (gn ^ wn).nonzero()[0])
        _fail(case, "%s: NaN at %s differs (got %r, expected %r)"
              % (name, i, float(got[i]), float(want[i])))
    both = ~gn
    gi, wi = torch.isinf(got) & both, torch.isinf(want_r) & both
    big = torch.finfo(dtype).max * 0.5
    inf_bad = (gi | wi) & ~((got == want_r) | (gi & (want.abs() >= big)))
    if inf_bad.any():
        i = tuple(int(x) for x in inf_bad.nonzero()[0])
        _fail(case, "%s: inf at %s differs (got %r, expected %r)"
              % (name, i, float(got[i]), float(want[i])))
    fin = both & ~gi & ~wi
    if device == "cuda" and not lse:
        # A value that cancels to (near) zero, such as dK of a row whose only key takes all the
        # probability (dS = P (dP - delta) = 0), keeps the fp32 rounding of its terms: 1e-5 of
        # their magnitude (the terms' absolute sum) bounds it, ~20x fp32's rounding of a
        # 512-term dot product.
        err = (got[fin] - want[fin]).norm()
        ref = want[fin].norm()
        floor = 1e-5 * mag[fin].norm() if torch.is_tensor(mag) and mag.shape == want.shape else 0.0
        if err > 2e-2 * ref + floor + 1e-6 * math.sqrt(max(1, int(fin.sum()))):
            _fail(case, "%s: relative L2 error %.3g (cuda bound 2e-2)" % (name, float(err / ref)))
        return
    if device == "cuda":  # lse on the GPU: SPEC's "about 1e-4 absolute", with room for bf16
        # inputs, and the fp32 rounding of the scores (1e-5 of their terms' magnitude, mag)
        tol = 2e-3 + 1e-5 * torch.maximum(want.abs(), mag)
    else:
        tol = ULP[dtype] * want_r.abs() + 1e-9 * mag + TINY[dtype]
    diff = (got - want_r).abs()
    bad = fin & (diff > tol)
    if bad.any():
        i = tuple(int(x) for x in bad.nonzero()[0])
        _fail(case, "%s[%s] = %r, expected %r (exact %r, tolerance %.3g; %d elements off)"
              % (name, ", ".join(map(str, i)), float(got[i]), float(want_r[i]), float(want[i]),
                 float(tol[i] if tol.dim() else tol), int(bad.sum())))


def _expect_error(case, fn, exc, pattern):
    try:
        fn()
    except exc as e:
        if not re.search(pattern, str(e)):
            _fail(case, "%s raised, but its message %r lacks %r" % (exc.__name__, str(e), pattern))
        return "error"
    except Exception as e:  # noqa: BLE001  (any other exception type is the failure)
        _fail(case, "expected %s matching %r, got %s: %s" % (exc.__name__, pattern,
                                                            type(e).__name__, e))
    _fail(case, "expected %s matching %r, the call succeeded" % (exc.__name__, pattern))


# ---- tensors from a case ------------------------------------------------------------------------
def _gen(case, salt):
    return torch.Generator().manual_seed((case["seed"] * 1000003 + salt) % (2**63))


def _uniform(shape, case, salt, amp=1.0):
    return (torch.rand(shape, generator=_gen(case, salt), dtype=torch.float64) * 2 - 1) * amp


def _strided(x, how, pad):
    """A view of x's values with other strides: 'padded' rows (every dimension of a larger buffer
    sliced; the last one stays contiguous), 'step' (every other element of dimension 0),
    'inner2' (a last-dimension stride of 2), or x itself."""
    if how == "padded":
        big = torch.full([n + pad for n in x.shape], float("nan"), dtype=x.dtype, device=x.device)
        v = big[tuple(slice(0, n) for n in x.shape)]
        v.copy_(x)
        return v
    if how == "step" and x.dim() >= 1:
        big = torch.full((2 * x.shape[0],) + tuple(x.shape[1:]), float("nan"), dtype=x.dtype,
                         device=x.device)
        v = big[::2]
        v.copy_(x)
        return v
    if how == "inner2" and x.dim() >= 1:
        big = torch.full(tuple(x.shape[:-1]) + (2 * x.shape[-1],), float("nan"), dtype=x.dtype,
                         device=x.device)
        v = big[..., ::2]
        v.copy_(x)
        return v
    return x


def _int_tensor(values, dtype_name, shape):
    return torch.tensor(values, dtype=getattr(torch, dtype_name)).reshape(shape)


def _fits(values, dtype_name):
    info = torch.iinfo(getattr(torch, dtype_name))
    return all(info.min <= x <= info.max for x in values)


def _flat(x):
    if isinstance(x, list):
        for y in x:
            yield from _flat(y)
    else:
        yield x


# ---- BSA through the Python API -----------------------------------------------------------------
BSA_FAULTS = ["scale", "block_size", "count", "bucket", "layout_value", "layout_type",
              "index_range", "index_duplicate", "index_int64", "count_value", "count_int64",
              "block_len_zero", "block_len_big", "block_len_int64", "k_dtype", "q_rank5",
              "index_shape", "q_int64", "kv_heads"]


@st.composite
def bsa_case(draw, device="cpu"):
    cuda = device == "cuda"
    c = {"op": "bsa", "seed": draw(st.integers(0, 2**62))}
    # Categorical choices from a seeded generator (uniform: Hypothesis' own choices concentrate on
    # a few values); Hypothesis draws the sizes, where its boundary values help.
    rng = random.Random(draw(st.integers(0, 2**62)))
    c["dtype"] = rng.choice(["bfloat16"] if cuda else list(DTYPES))
    c["layout"] = rng.choice(["bhsd", "bshd"])
    c["B"] = draw(st.integers(1, 2))
    c["Hkv"] = draw(st.integers(1, 2))
    c["Hq"] = c["Hkv"] * draw(st.integers(1, 3))
    c["block"] = rng.choice([64, 128])
    c["Sq"] = draw(st.integers(1, 300 if cuda else 200))
    c["Skv"] = draw(st.integers(1, 300 if cuda else 200))
    c["D"] = rng.choice([64, 128]) if cuda else draw(st.integers(1, 12))
    c["Dv"] = c["D"] if cuda else draw(st.integers(1, 12))
    n_q, n_kv = -(-c["Sq"] // c["block"]), -(-c["Skv"] // c["block"])
    c["mode"] = rng.choice(["q2k_count", "count", "kmax"])
    if c["mode"] == "kmax":
        c["Kmax"] = draw(st.integers(1, n_kv))
    else:
        c["Kmax"] = draw(st.integers(1, n_kv + 2))
    c["meta_b"] = 1 if rng.random() < 0.5 else c["B"]
    c["meta_h"] = 1 if rng.random() < 0.5 else c["Hq"]
    fixed = draw(st.integers(0, min(c["Kmax"], n_kv))) if c["mode"] == "count" else None
    c["count"] = fixed
    rows = []
    for b in range(c["meta_b"]):
        rb = []
        for h in range(c["meta_h"]):
            rh = []
            for m in range(n_q):
                if c["mode"] == "kmax":
                    n = c["Kmax"]
                elif c["mode"] == "count":
                    n = fixed
                else:
                    n = rng.randint(0, min(c["Kmax"], n_kv))
                blocks = rng.sample(range(n_kv), n)
                pad = [rng.randint(-3, n_kv + 3) for _ in range(c["Kmax"] - n)]
                rh.append((blocks + pad, n))
            rb.append(rh)
        rows.append(rb)
    c["index"] = [[[r[0] for r in rh] for rh in rb] for rb in rows]
    c["counts"] = [[[r[1] for r in rh] for rh in rb] for rb in rows]
    c["meta_dtype"] = rng.choice(["int32", "int64", "int16"])
    c["block_len"] = rng.choice([None, "n", "bn"])
    if c["block_len"] == "n":
        c["block_len_values"] = [rng.randint(1, c["block"]) for _ in range(n_kv)]
    elif c["block_len"] == "bn":
        c["block_len_values"] = [[rng.randint(1, c["block"]) for _ in range(n_kv)]
                                 for _ in range(c["B"])]
    c["strides"] = [rng.choice(["contiguous", "padded", "step", "inner2"])
                    for _ in range(3)]
    if cuda:  # GPU rows must stay 16-byte aligned: padding by 8 elements, no odd steps
        c["strides"] = [s if s in ("contiguous", "padded") else "contiguous" for s in c["strides"]]
    c["amp"] = rng.choice([1.0, 1.0, 4.0])
    c["scale"] = rng.choice([None, rng.uniform(0.01, 3.0), rng.uniform(-3.0, -0.01),
                             rng.choice([1e-30, 1e30, -1e20])])
    if cuda and not GPU_HUGE_SCALES and c["scale"] is not None and abs(c["scale"]) > 1e4:
        c["scale"] = None
    c["bucket"] = draw(st.integers(0, 3))
    c["deterministic"] = rng.random() < 0.5
    c["validate"] = rng.random() < 0.5
    c["backward"] = rng.random() < 0.5 and not (cuda and c["dtype"] != "bfloat16")
    c["nan_unread"] = rng.random() < 0.5
    faults = [f for f in BSA_FAULTS if not cuda or f not in ("q_int64",)]
    c["fault"] = rng.choice([None] * (2 * len(faults)) + faults)
    c["fault_pick"] = draw(st.integers(0, 2**31))
    return c


def _bsa_rows(c):
    """Full [B][Hq][N_q] index and count lists (metadata broadcast over B or H expanded)."""
    idx = [[c["index"][b if c["meta_b"] > 1 else 0][h if c["meta_h"] > 1 else 0]
            for h in range(c["Hq"])] for b in range(c["B"])]
    cnt = [[c["counts"][b if c["meta_b"] > 1 else 0][h if c["meta_h"] > 1 else 0]
            for h in range(c["Hq"])] for b in range(c["B"])]
    return idx, cnt


def _read_tokens(c, idx, cnt):
    """(b, kv head, token) triples that some row reads."""
    n_q = -(-c["Sq"] // c["block"])
    group = c["Hq"] // c["Hkv"]
    if c["block_len"] == "n":
        blen = lambda b, n: c["block_len_values"][n]  # noqa: E731
    elif c["block_len"] == "bn":
        blen = lambda b, n: c["block_len_values"][b][n]  # noqa: E731
    else:
        blen = lambda b, n: min(c["block"], c["Skv"] - n * c["block"])  # noqa: E731
    read = set()
    for b in range(c["B"]):
        for h in range(c["Hq"]):
            for m in range(n_q):
                for j in oracle.bsa_row_keys(idx, cnt, b, h, m, c["block"], c["Skv"], blen):
                    read.add((b, h // group, j))
    return read


def _physical(x, layout):
    return x.transpose(1, 2) if layout == "bshd" else x  # logical [B, H, S, X] -> the layout


def run_bsa(c, device="cpu"):
    dtype = DTYPES[c["dtype"]]
    idx, cnt = _bsa_rows(c)
    n_q = -(-c["Sq"] // c["block"])
    q = (_uniform((c["B"], c["Hq"], c["Sq"], c["D"]), c, 1, c["amp"])).to(dtype)
    k = (_uniform((c["B"], c["Hkv"], c["Skv"], c["D"]), c, 2, c["amp"])).to(dtype)
    v = _uniform((c["B"], c["Hkv"], c["Skv"], c["Dv"]), c, 3).to(dtype)
    if c["nan_unread"]:
        read = _read_tokens(c, idx, cnt)
        if device == "cuda":
            # The GPU paths load whole listed blocks and mask their padded keys (SPEC: they take
            # no part); whether NaN or inf there stays out of the result is not checked yet, so
            # only blocks that no row lists are poisoned.
            blocks = {(b, hk, j // c["block"]) for b, hk, j in read}
            read = {(b, hk, j) for b in range(c["B"]) for hk in range(c["Hkv"])
                    for j in range(c["Skv"]) if (b, hk, j // c["block"]) in blocks}
        for b in range(c["B"]):
            for hk in range(c["Hkv"]):
                for j in range(c["Skv"]):
                    if (b, hk, j) not in read:
                        k[b, hk, j] = float("nan")
                        v[b, hk, j] = float("inf")
    # The library sees these values (the oracle computes from them in float64).
    q64, k64, v64 = (x.double().clone() for x in (q, k, v))

    def place(x, how):
        phys = _physical(x, c["layout"]).contiguous().to(device)
        return _strided(phys, how, 8 if device == "cuda" else 3)

    qp, kp, vp = (place(x, s) for x, s in zip((q, k, v), c["strides"]))
    meta_shape = (c["meta_b"], c["meta_h"], n_q, c["Kmax"])
    index_vals = list(_flat(c["index"]))
    count_vals = list(_flat(c["counts"]))
    mdt = c["meta_dtype"]
    if not (_fits(index_vals, mdt) and _fits(count_vals, mdt)):
        mdt = "int32"
    kw = dict(block_size=c["block"], layout=c["layout"], scale=c["scale"],
              bucket_size=c["bucket"], deterministic=c["deterministic"], validate=c["validate"])
    q2k_index = _int_tensor(index_vals, mdt, meta_shape)
    q2k_count = None
    if c["mode"] == "q2k_count":
        q2k_count = _int_tensor(count_vals, mdt, meta_shape[:3])
    elif c["mode"] == "count":
        kw["count"] = c["count"]
    kv_block_len = None
    if c["block_len"] is not None:
        vals = c["block_len_values"]
        kv_block_len = torch.tensor(vals, dtype=getattr(torch, mdt))

    # ---- at most one fault, and the error it must raise --------------------------------------
    fault, pick = c["fault"], c["fault_pick"]
    expect = None
    ME = r"SA_ERROR_INVALID_METADATA: sparsity\.%s\["  # the CPU reference, GPU validate, Python
    rows_with = [(b, h, m) for b in range(c["meta_b"]) for h in range(c["meta_h"])
                 for m in range(n_q) if c["counts"][b][h][m] > 0]
    if fault == "scale":
        kw["scale"] = BAD_SCALES[pick % len(BAD_SCALES)]
        expect = (ValueError, r"SA_ERROR_INVALID_ARGUMENT: scale: expected None")
    elif fault == "block_size":
        kw["block_size"] = [96, 0, -64, 2**32 + 64, 2**31, 32][pick % 6]
        expect = (ValueError, r"options\.block_size: expected 64 or 128")
    elif fault == "count" and c["mode"] != "q2k_count":
        kw["count"] = [c["Kmax"] + 1, -2, 2**32 + 1, -(2**40)][pick % 4]
        expect = (ValueError, r"options\.count: expected -1 \(K_max\) or a value in \[0, ")
    elif fault == "bucket":
        kw["bucket_size"] = [-1, 2**32, -(2**31) - 1][pick % 3]
        expect = (ValueError, r"options\.bucket_size: expected >= 0")
    elif fault == "layout_value":
        kw["layout"] = ["sbhd", "", "BHSD "][pick % 3]
        expect = (ValueError, r"layout: expected 'bhsd' or 'bshd'")
    elif fault == "layout_type":
        kw["layout"] = [["bhsd"], 0, None][pick % 3]
        expect = (TypeError, r"layout: expected 'bhsd' or 'bshd' \(a str\)")
    elif fault in ("index_range", "index_duplicate", "index_int64") and rows_with:
        b, h, m = rows_with[pick % len(rows_with)]
        n = c["counts"][b][h][m]
        slot = pick % n
        t = q2k_index.to(torch.int64)
        if fault == "index_range":
            t[b, h, m, slot] = [-1, -(-c["Skv"] // c["block"]), 2**31 - 1][pick % 3]
        elif fault == "index_duplicate":
            if n < 2:
                t = None
            else:
                t[b, h, m, (slot + 1) % n] = t[b, h, m, slot]
        else:
            t[b, h, m, slot] = [2**32, 2**31, -(2**31) - 1, 2**62][pick % 4]
        if t is not None:
            q2k_index = t if fault == "index_int64" else t.to(q2k_index.dtype)
            if device == "cpu" or c["validate"]:
                expect = (ValueError, ME % "q2k_index")
            else:
                fault = "skipped"  # the GPU fast path trusts the metadata contract
    elif fault in ("count_value", "count_int64") and c["mode"] == "q2k_count":
        cells = [(b, h, m) for b in range(c["meta_b"]) for h in range(c["meta_h"])
                 for m in range(n_q)]
        b, h, m = cells[pick % len(cells)]
        t = q2k_count.to(torch.int64)
        t[b, h, m] = ([c["Kmax"] + 1, -1] if fault == "count_value" else
                      [2**32 + 1, -(2**32)])[pick % 2]
        q2k_count = t if fault == "count_int64" else t.to(q2k_count.dtype)
        if device == "cpu" or c["validate"]:
            expect = (ValueError, ME % "q2k_count")
        else:
            fault = "skipped"
    elif fault in ("block_len_zero", "block_len_big", "block_len_int64") and \
            kv_block_len is not None:
        t = kv_block_len.to(torch.int64).reshape(-1)
        i = pick % t.numel()
        t[i] = {"block_len_zero": 0, "block_len_big": c["block"] + 1,
                "block_len_int64": 2**32 + 64}[fault]
        t = t.reshape(kv_block_len.shape)
        kv_block_len = t if fault == "block_len_int64" else t.to(kv_block_len.dtype)
        if device == "cpu" or c["validate"]:
            expect = (ValueError, ME % "kv_block_len")
        else:
            fault = "skipped"
    elif fault == "k_dtype":
        other = torch.float32 if dtype != torch.float32 else torch.float64
        kp = kp.to(other)
        expect = (ValueError, r"k: expected dtype .* \(the dtype of q\)")
    elif fault == "q_rank5":
        qp = qp[None]
        expect = (ValueError, r"q: expected rank <= 4 \(the library's tensors\), got rank 5")
    elif fault == "index_shape":
        q2k_index = torch.zeros(c["B"], c["Hq"], n_q + 1, c["Kmax"], dtype=torch.int32)
        expect = (ValueError, r"sparsity\.q2k_index: expected shape \[B, H_q, N_q, K_max\]")
    elif fault == "q_int64":
        qp = qp.to(torch.int64)
        expect = (ValueError, r"q: unsupported dtype torch\.int64")
    elif fault == "kv_heads" and c["Hq"] > 1:
        shape = list(kp.shape)
        shape[1 if c["layout"] == "bhsd" else 2] = c["Hq"] + 1
        kp = torch.zeros(shape, dtype=kp.dtype, device=device)
        expect = (ValueError, r"k: H_kv = %d must divide H_q = %d" % (c["Hq"] + 1, c["Hq"]))
    else:
        fault = None
    if fault == "skipped":  # the GPU fast path trusts the metadata contract: no call
        return "skipped"

    q2k_index = q2k_index.to(device)
    q2k_count = None if q2k_count is None else q2k_count.to(device)
    kv_block_len = None if kv_block_len is None else kv_block_len.to(device)
    for t in (qp, kp, vp):
        if t.is_floating_point():
            t.requires_grad_(c["backward"])
    call = lambda: block_sparse_attention(qp, kp, vp, q2k_index, q2k_count,  # noqa: E731
                                          kv_block_len=kv_block_len, **kw)
    if expect is not None:
        return _expect_error(c, call, *expect)

    try:
        o, lse = call()
    except NotImplementedError:
        if device == "cuda":
            return "unsupported"
        raise
    scale = oracle.fp32(1.0 / math.sqrt(c["D"]) if c["scale"] is None else c["scale"])
    cnt_read = cnt if c["mode"] != "kmax" else [[[c["Kmax"]] * n_q for _ in range(c["Hq"])]
                                               for _ in range(c["B"])]
    blv = c.get("block_len_values") if c["block_len"] else None
    o_want, o_mag, lse_want, lse_mag = oracle.bsa_forward(q64, k64, v64, idx, cnt_read,
                                                          c["block"], scale, blv)
    o_log = _physical(o, c["layout"])
    _compare_forward(c, "o", o_log, o_want, o_mag, lse_mag, v64, dtype, device)
    _compare(c, "lse", lse, lse_want, lse_mag, torch.float32, device, lse=True)
    if not c["backward"]:
        return "ok"
    dout = _uniform((c["B"], c["Hq"], c["Sq"], c["Dv"]), c, 4).to(dtype)
    grads = torch.autograd.grad(o, (qp, kp, vp), _physical(dout, c["layout"]).to(device))
    want, mags = oracle.bsa_backward(q64, k64, v64, o_log.detach().double().cpu(),
                                     lse.double().cpu(), dout.double(), idx, cnt_read,
                                     c["block"], scale, blv)
    values = _conditioned(lse_mag)
    for name, g, w, m in zip(("dq", "dk", "dv"), grads, want, mags):
        _compare(c, name, _physical(g, c["layout"]), w, m, dtype, device, values=values)
    return "ok"


# ---- DSA through the Python API -----------------------------------------------------------------
DSA_FAULTS = ["scale", "dv_zero", "dv_big", "dv_huge", "sink_shape", "length_shape", "idx_rows",
              "q_rank", "kv_dqk", "idx_float", "dv_type"]
_IDX_EXTREMES32 = [INT32_MAX, INT32_MIN, INT32_MAX - 1]
_IDX_EXTREMES64 = [2**32 + 5, 2**31, -(2**32) + 2, 2**62, INT64_MIN, INT64_MAX]
_SINKS = [float("inf"), float("-inf"), 2.4e38, -2.4e38]


@st.composite
def dsa_case(draw, device="cpu"):
    cuda = device == "cuda"
    c = {"op": "dsa", "seed": draw(st.integers(0, 2**62))}
    rng = random.Random(draw(st.integers(0, 2**62)))
    c["dtype"] = rng.choice(["bfloat16"] if cuda else list(DTYPES))
    c["Sq"] = draw(st.integers(1, 8 if cuda else 10))
    c["Skv"] = draw(st.integers(1, 300 if cuda else 40))
    c["H"] = rng.choice([16, 32, 64]) if cuda else draw(st.integers(1, 4))
    c["Dqk"] = rng.choice([512, 576]) if cuda else draw(st.integers(1, 20))
    c["d_v"] = 512 if cuda else draw(st.integers(1, c["Dqk"]))
    c["topk"] = draw(st.integers(1, 64 if cuda else 12))
    c["idx_dtype"] = rng.choice(["int32", "int64", "int16"] +
                                (["uint8"] if c["Skv"] <= 255 else []))
    wide = c["idx_dtype"] == "int64"
    # How often a slot is valid, -1, near the range, or an extreme value.
    mix = rng.choice([(1.0, 0, 0), (0.7, 0.1, 0.1), (0.3, 0.3, 0.2), (0.5, 0.0, 0.5)])
    extremes = _IDX_EXTREMES32 + (_IDX_EXTREMES64 if wide else [])

    def index():
        u = rng.random()
        if u < mix[0]:
            return rng.randrange(c["Skv"])
        if u < mix[0] + mix[1]:
            return -1
        if u < mix[0] + mix[1] + mix[2]:
            return rng.randint(-5, c["Skv"] + 5)
        return rng.choice(extremes)

    c["idx"] = [[index() for _ in range(c["topk"])] for _ in range(c["Sq"])]
    if rng.random() < 0.5:
        ext = [INT32_MAX, INT32_MIN] + ([2**32, -(2**32) + 2, 2**62, INT64_MIN] if wide else [])
        c["length"] = [rng.choice([rng.randint(0, c["topk"]), rng.randint(-3, c["topk"] + 3),
                                   rng.choice(ext)]) for _ in range(c["Sq"])]
    else:
        c["length"] = None
    c["idx_layout"] = rng.choice(["contiguous", "transposed", "padded"])
    c["sink"] = None
    if rng.random() < 0.5:
        kinds = _SINKS + ([] if cuda else [float("nan")])
        special = rng.choice([0.0, 0.2, 1.0])
        c["sink"] = [rng.choice(kinds) if rng.random() < special else rng.uniform(-4, 4)
                     for _ in range(c["H"])]
        c["sink_dtype"] = rng.choice(["float32", "float64"])
    c["strides"] = [rng.choice(["contiguous", "padded", "step", "inner2"]) for _ in range(2)]
    if cuda:
        c["strides"] = [s if s in ("contiguous", "padded") else "contiguous" for s in c["strides"]]
    c["amp"] = rng.choice([1.0, 1.0, 3.0])
    c["scale"] = rng.choice([None, rng.uniform(0.01, 3.0), rng.uniform(-3.0, -0.01),
                             rng.choice([1e-30, 1e30])])
    if cuda and not GPU_HUGE_SCALES and c["scale"] is not None and abs(c["scale"]) > 1e4:
        c["scale"] = None
    c["deterministic"] = rng.random() < 0.5
    c["backward"] = rng.random() < 0.5
    c["nan_unread"] = rng.random() < 0.5
    c["fault"] = rng.choice([None] * (2 * len(DSA_FAULTS)) + DSA_FAULTS)
    c["fault_pick"] = draw(st.integers(0, 2**31))
    return c


def _dsa_index_values(c):
    """The values topk_idx holds after its dtype: values that do not fit a narrow dtype are
    replaced (the case's dtype says how the caller stores them)."""
    dt = c["idx_dtype"]
    info = torch.iinfo(getattr(torch, dt))
    inactive = -1 if info.min < 0 else info.max  # uint8: 255, drawn only with S_kv <= 255
    return [[x if info.min <= x <= info.max else inactive for x in row] for row in c["idx"]]


def run_dsa(c, device="cpu"):
    dtype = DTYPES[c["dtype"]]
    idx = _dsa_index_values(c)
    length = c["length"]
    if length is not None and c["idx_dtype"] != "int64":
        length = [max(INT32_MIN, min(INT32_MAX, x)) for x in length]
    q = _uniform((c["Sq"], c["H"], c["Dqk"]), c, 1, c["amp"]).to(dtype)
    kv = _uniform((c["Skv"], c["Dqk"]), c, 2, c["amp"]).to(dtype)
    if c["nan_unread"]:
        used = set()
        for t in range(c["Sq"]):
            used.update(oracle.dsa_active(idx[t], None if length is None else length[t],
                                          c["topk"], c["Skv"]))
        for j in range(c["Skv"]):
            if j not in used:
                kv[j] = float("nan")
    q64, kv64 = q.double().clone(), kv.double().clone()
    pad = 8 if device == "cuda" else 3
    qp = _strided(q.to(device), c["strides"][0], pad)
    kvp = _strided(kv.to(device), c["strides"][1], pad)
    it = torch.tensor(idx, dtype=getattr(torch, c["idx_dtype"]))
    if c["idx_layout"] == "transposed":
        it = it.T.contiguous().T
    elif c["idx_layout"] == "padded":
        it = torch.nn.functional.pad(it, (0, 2))[:, : c["topk"]]
    lt = None if length is None else torch.tensor(
        length, dtype=torch.int64 if c["idx_dtype"] == "int64" else torch.int32)
    sink = None
    if c["sink"] is not None:
        sink = torch.tensor(c["sink"], dtype=getattr(torch, c["sink_dtype"]))
    kw = dict(topk_length=lt, sink=sink, d_v=c["d_v"], scale=c["scale"],
              deterministic=c["deterministic"])

    fault, pick = c["fault"], c["fault_pick"]
    expect = None
    if fault == "scale":
        kw["scale"] = BAD_SCALES[pick % len(BAD_SCALES)]
        expect = (ValueError, r"SA_ERROR_INVALID_ARGUMENT: scale: expected None")
    elif fault == "dv_zero":
        kw["d_v"] = [0, -5][pick % 2]
        expect = (ValueError, r"options\.d_v: expected a value in \[1, D_qk = %d\]" % c["Dqk"])
    elif fault == "dv_big":
        kw["d_v"] = c["Dqk"] + 1
        expect = (ValueError, r"options\.d_v: expected a value in \[1, D_qk = %d\]" % c["Dqk"])
    elif fault == "dv_huge":
        kw["d_v"] = [2**32 + 8, -(2**31) - 1][pick % 2]
        expect = (ValueError, r"options\.d_v: expected ")
    elif fault == "dv_type":
        kw["d_v"] = [8.0, "8"][pick % 2]  # None is valid: the default width 512
        expect = (TypeError, r"d_v: expected an int or None, got ")
    elif fault == "sink_shape":
        kw["sink"] = torch.zeros(c["H"] + 1)
        expect = (ValueError, r"sink: expected shape \[H\] = \[%d\]" % c["H"])
    elif fault == "length_shape":
        kw["topk_length"] = torch.ones(c["Sq"] + 1, dtype=torch.int32)
        expect = (ValueError, r"topk_length: expected shape \[S_q\] = \[%d\]" % c["Sq"])
    elif fault == "idx_rows":
        it = torch.zeros(c["Sq"] + 1, c["topk"], dtype=torch.int32)
        expect = (ValueError, r"topk_idx: expected shape \[S_q, topk\] = \[%d, topk >= 1\]"
                  % c["Sq"])
    elif fault == "q_rank":
        qp = qp[0]
        expect = (ValueError, r"q: expected rank 3")
    elif fault == "kv_dqk":
        kvp = torch.zeros(c["Skv"], c["Dqk"] + 1, dtype=kvp.dtype, device=device)
        expect = (ValueError, r"kv: expected shape \[S_kv, D_qk\] with D_qk = %d" % c["Dqk"])
    elif fault == "idx_float":
        it = it.float()
        expect = (ValueError, r"topk_idx: expected dtype int32")
    else:
        fault = None

    it = it.to(device)
    if kw["topk_length"] is not None:
        kw["topk_length"] = kw["topk_length"].to(device)
    if kw["sink"] is not None:
        kw["sink"] = kw["sink"].to(device)
        kw["sink"].requires_grad_(c["backward"] and expect is None)
    for t in (qp, kvp):
        t.requires_grad_(c["backward"] and t.is_floating_point())
    call = lambda: deepseek_sparse_attention(qp, kvp, it, **kw)  # noqa: E731
    if expect is not None:
        return _expect_error(c, call, *expect)
    try:
        out, lse = call()
    except NotImplementedError:
        if device == "cuda":
            return "unsupported"
        raise
    scale = oracle.fp32(1.0 / math.sqrt(c["Dqk"]) if c["scale"] is None else c["scale"])
    sink64 = None if sink is None else sink.detach().float().double()
    o_want, o_mag, lse_want, lse_mag = oracle.dsa_forward(q64, kv64, idx, length, sink64,
                                                          c["d_v"], scale)
    _compare_forward(c, "out", out, o_want, o_mag, lse_mag, kv64[:, :c["d_v"]], dtype, device)
    _compare(c, "lse", lse, lse_want, lse_mag, torch.float32, device, lse=True)
    if not c["backward"]:
        return "ok"
    dout = _uniform((c["Sq"], c["H"], c["d_v"]), c, 4).to(dtype)
    inputs = [qp, kvp] + ([kw["sink"]] if sink is not None else [])
    grads = torch.autograd.grad(out, inputs, dout.to(device))
    want, mags = oracle.dsa_backward(q64, kv64, out.detach().double().cpu(), lse.double().cpu(),
                                     dout.double(), idx, length, sink64, c["d_v"], scale)
    values = _conditioned(lse_mag)
    _compare(c, "dq", grads[0], want[0], mags[0], dtype, device, values=values)
    _compare(c, "dkv", grads[1], want[1], mags[1], dtype, device, values=values)
    if sink is not None:
        _compare(c, "d_sink", grads[2], want[2], mags[2], torch.float32, device, values=values)
    return "ok"


def api_case(device="cpu"):
    return st.one_of(bsa_case(device), dsa_case(device))


def run_api(case, device="cpu"):
    return run_bsa(case, device) if case["op"] == "bsa" else run_dsa(case, device)


# ---- the C ABI through ctypes -------------------------------------------------------------------
_RAW_RANKS = [-1, 0, 1, 2, 3, 4, 5, INT32_MAX, INT32_MIN]
_RAW_ENUMS = [-1, 5, 99, INT32_MAX, INT32_MIN]
_RAW_DEVICES = [2, -1, 77, 1]


@st.composite
def abi_case(draw):
    base = draw(st.one_of(bsa_case(), dsa_case()))
    base["fault"] = None
    base["nan_unread"] = False
    base["strides"] = [s if s != "inner2" else "contiguous" for s in base["strides"]]
    if base["op"] == "bsa":
        base["meta_dtype"] = "int32"
        base["scale"] = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    else:
        base["idx_dtype"] = "int32"
        base["idx"] = [[max(INT32_MIN, min(INT32_MAX, x)) for x in row] for row in base["idx"]]
        if base["length"] is not None:
            base["length"] = [max(INT32_MIN, min(INT32_MAX, x)) for x in base["length"]]
        base["scale"] = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
        if base["sink"] is not None:
            base["sink_dtype"] = "float32"
    rng = random.Random(draw(st.integers(0, 2**62)))
    base["abi_backward"] = rng.random() < 0.5
    base["perturb"] = rng.choice([None, None, "rank", "dtype", "device", "neg_shape",
                                  "neg_stride", "zero_stride_out", "overflow_stride",
                                  "overflow_shape", "null", "inner_stride", "option", "option"])
    base["perturb_pick"] = rng.randrange(2**31)
    return base


def _bsa_abi_args(c, backward):
    """Valid BSA argument structs over fresh buffers: (args, outputs, check_outputs)."""
    dtype = DTYPES[c["dtype"]]
    idx, cnt = _bsa_rows(c)
    n_q = -(-c["Sq"] // c["block"])
    q = _uniform((c["B"], c["Hq"], c["Sq"], c["D"]), c, 1, c["amp"]).to(dtype)
    k = _uniform((c["B"], c["Hkv"], c["Skv"], c["D"]), c, 2, c["amp"]).to(dtype)
    v = _uniform((c["B"], c["Hkv"], c["Skv"], c["Dv"]), c, 3).to(dtype)
    phys = lambda x, how: _strided(_physical(x, c["layout"]).contiguous(), how, 3)  # noqa: E731
    qp, kp, vp = (phys(x, s) for x, s in zip((q, k, v), c["strides"]))
    index = _int_tensor(list(_flat(c["index"])), "int32",
                        (c["meta_b"], c["meta_h"], n_q, c["Kmax"]))
    index = index.expand(c["B"], c["Hq"], n_q, c["Kmax"])
    count = None
    if c["mode"] == "q2k_count":
        count = _int_tensor(list(_flat(c["counts"])), "int32", (c["meta_b"], c["meta_h"], n_q))
        count = count.expand(c["B"], c["Hq"], n_q)
    blen = None
    if c["block_len"] is not None:
        blen = torch.tensor(c["block_len_values"], dtype=torch.int32)
    layout = _abi.SA_LAYOUT_BSHD if c["layout"] == "bshd" else _abi.SA_LAYOUT_BHSD
    raw_count = -1 if c["mode"] == "kmax" else (c["count"] if c["mode"] == "count" else -1)
    opts = _ops._bsa_options(c["block"], layout, raw_count,
                             0.0 if c["scale"] is None else c["scale"], c["bucket"],
                             c["deterministic"], c["validate"])
    o = torch.full(_physical(torch.empty(c["B"], c["Hq"], c["Sq"], c["Dv"]), c["layout"]).shape,
                   float("nan"), dtype=dtype)
    lse = torch.full((c["B"], c["Hq"], c["Sq"]), float("nan"))
    fwd = _ops._bsa_fwd_args(qp, kp, vp, index, count, blen, o, lse, opts, False)
    keep = [qp, kp, vp, index, count, blen, o, lse]
    if not backward:
        return "bsa_forward", fwd, [("o", o), ("lse", lse)], keep, (q, k, v, idx, cnt)
    ok = _abi.LIB.sa_bsa_forward(ctypes.byref(fwd), None)
    assert ok == 0, _abi.LIB.sa_last_error()
    dout = phys(_uniform((c["B"], c["Hq"], c["Sq"], c["Dv"]), c, 4).to(dtype), "contiguous")
    dq, dk, dv = (torch.full(t.shape, float("nan"), dtype=dtype) for t in (qp, kp, vp))
    bwd = _ops._bsa_bwd_args(dout, qp, kp, vp, o, lse, index, count, blen, dq, dk, dv, opts,
                             False)
    keep += [dout, dq, dk, dv]
    return ("bsa_backward", bwd, [("dq", dq), ("dk", dk), ("dv", dv)], keep,
            (q, k, v, idx, cnt, o, lse, dout))


def _dsa_abi_args(c, backward):
    dtype = DTYPES[c["dtype"]]
    q = _uniform((c["Sq"], c["H"], c["Dqk"]), c, 1, c["amp"]).to(dtype)
    kv = _uniform((c["Skv"], c["Dqk"]), c, 2, c["amp"]).to(dtype)
    qp, kvp = _strided(q, c["strides"][0], 3), _strided(kv, c["strides"][1], 3)
    it = torch.tensor(c["idx"], dtype=torch.int32)
    lt = None if c["length"] is None else torch.tensor(c["length"], dtype=torch.int32)
    sink = None if c["sink"] is None else torch.tensor(c["sink"], dtype=torch.float32)
    opts = _ops._dsa_options(c["d_v"], 0.0 if c["scale"] is None else c["scale"],
                             c["deterministic"])
    out = torch.full((c["Sq"], c["H"], c["d_v"]), float("nan"), dtype=dtype)
    lse = torch.full((c["Sq"], c["H"]), float("nan"))
    fwd = _ops._dsa_fwd_args(qp, kvp, it, lt, sink, out, lse, opts, False)
    keep = [qp, kvp, it, lt, sink, out, lse]
    if not backward:
        return "dsa_forward", fwd, [("out", out), ("lse", lse)], keep, (q, kv, sink)
    ok = _abi.LIB.sa_dsa_forward(ctypes.byref(fwd), None)
    assert ok == 0, _abi.LIB.sa_last_error()
    dout = _uniform((c["Sq"], c["H"], c["d_v"]), c, 4).to(dtype)
    dq = torch.full(qp.shape, float("nan"), dtype=dtype)
    dkv = torch.full(kvp.shape, float("nan"), dtype=dtype)
    d_sink = torch.full((c["H"],), float("nan"))
    bwd = _ops._dsa_bwd_args(dout, qp, kvp, out, lse, it, lt, sink, dq, dkv, d_sink, opts, False)
    keep += [dout, dq, dkv, d_sink]
    return ("dsa_backward", bwd, [("dq", dq), ("dkv", dkv), ("d_sink", d_sink)], keep,
            (q, kv, sink, out, lse, dout))


_OPTIONAL = {"sparsity.q2k_count", "sparsity.kv_block_len", "topk_length", "sink", "d_sink"}
_INNER_CONTIGUOUS = {"q", "k", "v", "o", "dout", "dq", "dk", "dv", "kv", "out", "dkv"}


def _tensor_fields(args, prefix=""):
    out = []
    for name, ftype in args._fields_:
        if ftype is _abi.sa_tensor:
            out.append((prefix + name, getattr(args, name)))
        elif ftype is _abi.sa_bsa_sparsity:
            out += _tensor_fields(getattr(args, name), "sparsity.")
    return out


def _perturb(c, op, args, outputs):
    """Sets one field of args to an adversarial raw value. Returns (expected status, the
    argument name the message must start with, or None to accept any named argument), or None
    when the drawn perturbation does not apply to this call (the call then runs unchanged)."""
    kind, pick = c["perturb"], c["perturb_pick"]
    if kind is None:
        return None
    bad = _abi.SA_ERROR_INVALID_ARGUMENT
    if kind == "option":
        o = args.options
        is_bsa = op.startswith("bsa")
        choices = ["scale", "impl", "impl_forced"] + (
            ["block_size", "layout", "count", "bucket_size"] if is_bsa else ["d_v"])
        field = choices[pick % len(choices)]
        if field == "scale":
            o.scale = [math.nan, math.inf, -math.inf, 1e-40, -1e-45, 3e38, -3e38][pick % 7]
            return bad, "options.scale"
        if field == "impl":
            o.impl = [4, -1, 99][pick % 3]
            return bad, "options.impl"
        if field == "impl_forced":
            o.impl = [_abi.SA_IMPL_AUTO + 2, _abi.SA_IMPL_AUTO + 3][pick % 2]
            return _abi.SA_ERROR_UNSUPPORTED, "options.impl"
        if field == "block_size":
            o.block_size = [0, -1, 63, 96, 256, INT32_MAX, INT32_MIN][pick % 7]
            return bad, "options.block_size"
        if field == "layout":
            o.layout = [2, -1, 99][pick % 3]
            return bad, "options.layout"
        if field == "count":
            if args.sparsity.q2k_count.data:
                return None  # q2k_count given: count is not read
            o.count = [-2, INT32_MIN, c["Kmax"] + 1, INT32_MAX][pick % 4]
            return bad, "options.count"
        if field == "bucket_size":
            o.bucket_size = [-1, INT32_MIN][pick % 2]
            return bad, "options.bucket_size"
        o.d_v = [-1, c["Dqk"] + 1, INT32_MAX, INT32_MIN][pick % 4]
        return bad, "options.d_v"
    present = [(n, t) for n, t in _tensor_fields(args) if t.data]
    name, t = present[pick % len(present)]
    dims = list(range(t.rank))
    if kind == "rank":
        options = [r for r in _RAW_RANKS if r != t.rank and
                   not (name == "sparsity.kv_block_len" and r in (1, 2))]
        t.rank = options[pick % len(options)]
        return bad, name
    if kind == "dtype":
        t.dtype = _RAW_ENUMS[pick % len(_RAW_ENUMS)]
        return bad, name
    if kind == "device":
        t.device = _RAW_DEVICES[pick % len(_RAW_DEVICES)]
        return bad, name
    if kind == "neg_shape" and dims:
        t.shape[dims[pick % len(dims)]] = [-1, INT64_MIN][pick % 2]
        return bad, name
    if kind == "neg_stride":
        big = [d for d in dims if t.shape[d] > 1]
        if not big:
            return None
        t.strides[big[pick % len(big)]] = [-1, INT64_MIN, -t.strides[big[0]] - 1][pick % 3]
        return bad, name
    if kind == "zero_stride_out":
        big = [d for d in dims if t.shape[d] > 1]
        if name not in outputs or not big:
            return None
        t.strides[big[pick % len(big)]] = 0
        return bad, name
    if kind == "overflow_stride":
        # Strides whose farthest element (or byte) lies past 2^63 - 1: always an error.
        big = [d for d in dims if t.shape[d] > 2]
        if not big:
            return None
        d = big[pick % len(big)]
        esize = {0: 2, 1: 2, 2: 4, 3: 8, 4: 4}.get(t.dtype, 1)
        t.strides[d] = [INT64_MAX, 2**62, -(-(2**63) // (esize * (t.shape[d] - 1)))][pick % 3]
        return bad, name
    if kind == "overflow_shape":
        if not dims:
            return None
        d = dims[pick % len(dims)]
        rest = 1
        for i in dims:
            if i != d:
                rest *= max(t.shape[i], 0)
        if rest < 2:
            return None
        t.shape[d] = [INT64_MAX, 2**62, 2**63 // rest + 1][pick % 3]
        return bad, name
    if kind == "null":
        if name in _OPTIONAL:
            return None
        t.data = None
        return bad, name
    if kind == "inner_stride":
        if name not in _INNER_CONTIGUOUS or t.rank < 1 or t.shape[t.rank - 1] < 2:
            return None
        t.strides[t.rank - 1] = 2
        return bad, name
    return None


def run_abi(c, device="cpu"):
    backward = c["abi_backward"]
    builder = _bsa_abi_args if c["op"] == "bsa" else _dsa_abi_args
    op, args, outputs, keep, extra = builder(c, backward)
    before = [t.clone() for _, t in outputs]
    expect = _perturb(c, op, args, {n for n, _ in outputs})
    nbytes = ctypes.c_size_t(12345)
    ws = getattr(_abi.LIB, "sa_%s_workspace_size" % op)(ctypes.byref(args), ctypes.byref(nbytes))
    ws_msg = _abi.LIB.sa_last_error().decode(errors="replace")
    st_ = getattr(_abi.LIB, "sa_%s" % op)(ctypes.byref(args), None)
    msg = _abi.LIB.sa_last_error().decode(errors="replace")
    del keep
    if expect is not None:
        code, name = expect
        if st_ != code or ws != code:
            _fail(c, "%s with a bad %s: status %d (workspace query %d), expected %d: %s"
                  % (op, name, st_, ws, code, msg))
        if not msg.startswith(name + ":") and not msg.startswith(name + " ") and \
                not (name == "options.impl" and "options.impl" in msg):
            _fail(c, "%s: the message does not start with %r: %s" % (op, name, msg))
        if ws_msg != msg:
            _fail(c, "%s: the workspace query said %r, the call %r" % (op, ws_msg, msg))
        for (oname, t), b in zip(outputs, before):
            if not torch.equal(torch.isnan(t), torch.isnan(b)) or not torch.equal(
                    t.nan_to_num(1.5), b.nan_to_num(1.5)):
                _fail(c, "%s: a rejected call wrote %s" % (op, oname))
        return "rejected"
    if st_ != 0:
        _fail(c, "%s: a valid call failed with status %d: %s" % (op, st_, msg))
    # Values: the oracle on the same inputs.
    if c["op"] == "bsa":
        q, k, v, idx, cnt = extra[:5]
        n_q = -(-c["Sq"] // c["block"])
        cnt_read = cnt if c["mode"] != "kmax" else [[[c["Kmax"]] * n_q for _ in range(c["Hq"])]
                                                   for _ in range(c["B"])]
        scale = oracle.fp32(1.0 / math.sqrt(c["D"]) if c["scale"] is None else c["scale"])
        blv = c.get("block_len_values") if c["block_len"] else None
        dtype = DTYPES[c["dtype"]]
        if not backward:
            ow, om, lw, lm = oracle.bsa_forward(q.double(), k.double(), v.double(), idx, cnt_read,
                                                c["block"], scale, blv)
            _compare(c, "o", _physical(outputs[0][1], c["layout"]), ow, om, dtype, "cpu")
            _compare(c, "lse", outputs[1][1], lw, lm, torch.float32, "cpu", lse=True)
        else:
            o, lse, dout = extra[5], extra[6], extra[7]
            want, mags = oracle.bsa_backward(
                q.double(), k.double(), v.double(), _physical(o, c["layout"]).double(),
                lse.double(), _physical(dout, c["layout"]).double(), idx, cnt_read, c["block"],
                scale, blv)
            for (name, g), w, m in zip(outputs, want, mags):
                _compare(c, name, _physical(g, c["layout"]), w, m, dtype, "cpu")
    else:
        q, kv, sink = extra[:3]
        scale = oracle.fp32(1.0 / math.sqrt(c["Dqk"]) if c["scale"] is None else c["scale"])
        sink64 = None if sink is None else sink.double()
        dtype = DTYPES[c["dtype"]]
        if not backward:
            ow, om, lw, lm = oracle.dsa_forward(q.double(), kv.double(), c["idx"], c["length"],
                                                sink64, c["d_v"], scale)
            _compare(c, "out", outputs[0][1], ow, om, dtype, "cpu")
            _compare(c, "lse", outputs[1][1], lw, lm, torch.float32, "cpu", lse=True)
        else:
            out, lse, dout = extra[3], extra[4], extra[5]
            want, mags = oracle.dsa_backward(q.double(), kv.double(), out.double(), lse.double(),
                                             dout.double(), c["idx"], c["length"], sink64,
                                             c["d_v"], scale)
            for (name, g), w, m, dt in zip(outputs, want, mags,
                                           (dtype, dtype, torch.float32)):
                if name == "d_sink" and sink is None:
                    if not torch.equal(g, torch.zeros_like(g)):
                        _fail(c, "d_sink without a sink: expected zeros, got %s" % g)
                    continue
                _compare(c, name, g, w, m, dt, "cpu")
    return "ok"


RUNNERS = {"api": run_api, "abi": run_abi}
STRATEGIES = {"api": api_case, "abi": lambda device="cpu": abi_case()}
