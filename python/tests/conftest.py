"""Shared helpers: independent dense oracles in plain torch (fp64) and input builders.

The oracles know nothing of the library: they build the token-level mask of SPEC's rules and run
ordinary softmax attention, so both the C++ reference (through the package) and later GPU paths
are checked against them, values and gradients (through torch autograd).
"""

import math
import os

import pytest
import torch

import sparse_attention  # noqa: F401  (fails loudly when the library cannot be loaded)


def fp32_scale(scale, d):
    """The softmax scale as the library applies it: the C ABI carries it as a float."""
    return float(torch.tensor(1.0 / math.sqrt(d) if scale is None else scale, dtype=torch.float32))


def pytest_report_header(config):
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return "torch %s; sparse_attention %s from %s; %s" % (
        torch.__version__, sparse_attention.__version__, sparse_attention.library_path, cuda)


# ---- BSA ----------------------------------------------------------------------------------------
def bsa_token_mask(q2k_index, q2k_count, count, block, s_q, s_kv, kv_block_len=None):
    """[B, H_q, S_q, S_kv] bool: query token i sees key j (SPEC section 1)."""
    b, h, n_q, k_max = q2k_index.shape
    n_kv = (s_kv + block - 1) // block
    idx = q2k_index.long().cpu()
    if q2k_count is not None:
        cnt = q2k_count.long().cpu()
    else:
        cnt = torch.full((b, h, n_q), k_max if count is None else count, dtype=torch.long)
    blocks = torch.zeros(b, h, n_q, n_kv, dtype=torch.bool)
    for bb in range(b):
        for hh in range(h):
            for m in range(n_q):
                for slot in range(int(cnt[bb, hh, m])):
                    blocks[bb, hh, m, idx[bb, hh, m, slot]] = True
    if kv_block_len is None:
        valid_key = torch.arange(s_kv) < s_kv
        valid_key = valid_key.expand(b, s_kv)
    else:
        bl = kv_block_len.long().cpu()
        if bl.dim() == 1:
            bl = bl.expand(b, n_kv)
        offs = torch.arange(s_kv) % block
        valid_key = offs.expand(b, s_kv) < bl[:, torch.arange(s_kv) // block]
    tok = blocks.repeat_interleave(block, 2).repeat_interleave(block, 3)[:, :, :s_q, :s_kv]
    return tok & valid_key[:, None, None, :]


def bsa_dense(q, k, v, mask, scale=None, layout="bhsd"):
    """Dense masked attention: (o, lse) with O = 0 and LSE = -inf for rows with no keys."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    scale = fp32_scale(scale, q.shape[-1])
    s = scale * q @ k.transpose(-1, -2)
    s = s.masked_fill(~mask.to(s.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))  # empty rows: s = -inf
    p = p.masked_fill(~mask.to(s.device), 0.0)
    o = p @ v
    if layout == "bshd":
        o = o.transpose(1, 2)
    return o, lse


def random_bsa_meta(b, h, n_q, n_kv, density=0.5, generator=None, empty_rows=True):
    mask = torch.rand(b, h, n_q, n_kv, generator=generator) < density
    if not empty_rows:
        mask[..., 0] = True
    return mask


# ---- DSA ----------------------------------------------------------------------------------------
def dsa_dense(q, kv, topk_idx, topk_length=None, sink=None, d_v=512, scale=None):
    """(out, lse) of SPEC section 2 with plain torch ops (differentiable in q, kv and sink)."""
    s_q, h, d_qk = q.shape
    s_kv = kv.shape[0]
    topk = topk_idx.shape[1]
    idx = topk_idx.long()
    active = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        active &= torch.arange(topk, device=idx.device) < topk_length.long().clamp(max=topk)[:, None]
    keys = kv[idx.clamp(0, s_kv - 1)]  # [S_q, topk, D_qk]
    scale = fp32_scale(scale, d_qk)
    s = scale * torch.einsum("thd,tkd->thk", q, keys)
    s = s.masked_fill(~active[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for empty rows
    empty = ~active.any(dim=-1)  # [S_q]
    if sink is not None:
        # The library takes the sink as fp32.
        big_l = torch.logaddexp(lse, sink.float().to(lse.dtype)[None, :])
    else:
        big_l = lse
    big_l_safe = big_l.masked_fill(big_l == float("-inf"), 0.0)  # empty row, no sink
    p = torch.exp(s - big_l_safe.unsqueeze(-1)).masked_fill(~active[:, None, :], 0.0)
    out = torch.einsum("thk,tkd->thd", p, keys[..., :d_v])
    lse = lse.masked_fill(empty[:, None], float("inf"))
    return out, lse


def needs_cuda():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---- the command-line tool --------------------------------------------------------------------
def cli_binary():
    """The built `sparse-attention` binary: SA_CLI, else build/ of this checkout; None if absent."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("SA_CLI") or os.path.join(here, "..", "..", "build", "sparse-attention")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


needs_cli = pytest.mark.skipif(cli_binary() is None,
                               reason="no sparse-attention binary (build/ or SA_CLI)")


# ---- a session in which nothing ran must not pass ---------------------------------------------------
_passed = 0


def pytest_runtest_logreport(report):
    global _passed
    if report.when == "call" and report.passed:
        _passed += 1


def pytest_sessionfinish(session, exitstatus):
    # pytest already fails with exit code 5 when nothing is collected; also fail when every
    # collected test was skipped or deselected, so a broken environment cannot look green.
    if exitstatus == 0 and _passed == 0:
        session.exitstatus = 1
        print("\nno test passed: every test was skipped or deselected")
