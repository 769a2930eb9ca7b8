"""An independent fp64 implementation of SPEC sections 1 and 2 for the fuzz suite.

Written from SPEC's formulas in plain torch float64, one metadata row at a time; it shares no code
with the library (or with its C++ reference). Inputs are CPU float64 tensors holding the values the
library sees (already rounded to the call's dtype) in logical order: BSA tensors as [B, H, S, X]
whatever the call's layout.

Every function returns (value, magnitude) pairs: the magnitude is the same sum taken over absolute
values, which bounds the rounding of any summation order and sets the tolerance of a comparison.

Backward formulas take the forward outputs the library stored (o, lse) as SPEC says: `Delta` from
the stored o, probabilities recomputed from the stored fp32 LSE and capped at 1 (the documented
rule that keeps them probabilities when the LSE's rounding exceeds exp's range).
"""

import math

import torch

INF = float("inf")


def fp32(x: float) -> float:
    """x as the C ABI's float field carries it."""
    return float(torch.tensor(x, dtype=torch.float32))


# ---- BSA (SPEC 1) -------------------------------------------------------------------------------
def bsa_row_keys(idx, cnt, b, h, m, block, s_kv, block_len):
    """The key tokens query block m of (b, h) attends: the valid keys of its listed blocks."""
    keys = []
    for slot in range(cnt[b][h][m]):
        n = idx[b][h][m][slot]
        first = n * block
        for j in range(first, min(first + block_len(b, n), s_kv)):
            keys.append(j)
    return keys


def _block_len_fn(kv_block_len, block, s_kv):
    if kv_block_len is None:
        return lambda b, n: min(block, s_kv - n * block)
    if isinstance(kv_block_len[0], list):
        return lambda b, n: kv_block_len[b][n]
    return lambda b, n: kv_block_len[n]


def bsa_forward(q, k, v, idx, cnt, block, scale, kv_block_len=None):
    """(o, o_mag, lse, lse_mag; lse_mag: the row's largest score-term magnitude
    |scale| * sum_i |q_i k_i|, which bounds a score's fp32 rounding) with q [B, Hq, Sq, D],
    k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] float64; idx[b][h][m][slot] and cnt[b][h][m] Python
    ints (cnt: the entries each row reads)."""
    B, Hq, Sq, _ = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    blen = _block_len_fn(kv_block_len, block, Skv)
    o = torch.zeros(B, Hq, Sq, Dv, dtype=torch.float64)
    mag = torch.zeros_like(o)
    lse = torch.full((B, Hq, Sq), -INF, dtype=torch.float64)
    lse_mag = torch.zeros(B, Hq, Sq, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            for m in range((Sq + block - 1) // block):
                keys = bsa_row_keys(idx, cnt, b, h, m, block, Skv, blen)
                if not keys:
                    continue
                rows = slice(m * block, min((m + 1) * block, Sq))
                kk, vv = k[b, h // group, keys], v[b, h // group, keys]
                s = scale * (q[b, h, rows] @ kk.T)
                lrow = torch.logsumexp(s, dim=-1)
                p = _softmax(s)
                o[b, h, rows] = p @ vv
                mag[b, h, rows] = p @ vv.abs()
                lse[b, h, rows] = lrow
                terms = abs(scale) * (q[b, h, rows].abs() @ kk.abs().T)
                lse_mag[b, h, rows] = terms.max(dim=-1).values
    return o, mag, lse, lse_mag


def bsa_backward(q, k, v, o, lse, dout, idx, cnt, block, scale, kv_block_len=None):
    """((dq, dk, dv), (dq_mag, dk_mag, dv_mag)) from the stored o and lse (float64 tensors)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    blen = _block_len_fn(kv_block_len, block, Skv)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    mq, mk, mv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    a = abs(scale)
    for b in range(B):
        for h in range(Hq):
            hk = h // group
            for m in range((Sq + block - 1) // block):
                keys = bsa_row_keys(idx, cnt, b, h, m, block, Skv, blen)
                if not keys:
                    continue
                r0, r1 = m * block, min((m + 1) * block, Sq)
                live = [i for i in range(r0, r1) if float(lse[b, h, i]) != -INF]
                if not live:
                    continue
                kt = torch.tensor(keys)
                kk, vv = k[b, hk, keys], v[b, hk, keys]
                qq, oo, do = q[b, h, live], o[b, h, live], dout[b, h, live]
                s = scale * (qq @ kk.T)
                p = torch.exp(s - lse[b, h, live][:, None]).clamp(max=1.0)
                delta = (do * oo).sum(-1)
                dp = do @ vv.T
                ds = p * (dp - delta[:, None])
                dsm = p * ((do.abs() @ vv.abs().T) + (do * oo).abs().sum(-1)[:, None])
                dq[b, h, live] += scale * (ds @ kk)
                mq[b, h, live] += a * (dsm @ kk.abs())
                dk[b, hk].index_add_(0, kt, scale * (ds.T @ qq))
                mk[b, hk].index_add_(0, kt, a * (dsm.T @ qq.abs()))
                dv[b, hk].index_add_(0, kt, p.T @ do)
                mv[b, hk].index_add_(0, kt, p.T @ do.abs())
    return (dq, dk, dv), (mq, mk, mv)


# ---- DSA (SPEC 2) -------------------------------------------------------------------------------
def dsa_active(idx_row, length, topk, s_kv):
    """The active slots' key rows of one token, in slot order, repeats kept."""
    n = topk if length is None else max(0, min(length, topk))
    return [j for j in idx_row[:n] if 0 <= j < s_kv]


def _softmax(s):
    """exp(s - lse) along the last dim as exp(s - max) / sum: max + log(sum) rounds to max at
    huge scores (|max| >> 2^53 log(sum)), which would give every tied key probability 1."""
    m = s.max(dim=-1, keepdim=True).values
    e = torch.exp(s - m)
    return e / e.sum(dim=-1, keepdim=True)


def _big_l(lse_row, sink):
    """L = logaddexp(lse, sink) per head, with SPEC's infinite sinks (+inf takes everything,
    -inf is no sink) and NaN propagating."""
    if sink is None:
        return lse_row.clone()
    return torch.logaddexp(lse_row, sink)


def dsa_forward(q, kv, idx, length, sink, d_v, scale):
    """(out, out_mag, lse, lse_mag; lse_mag as in bsa_forward): q [Sq, H, Dqk], kv [Skv, Dqk]
    float64; idx[t] a list of ints (any value), length a list of ints or None, sink [H] float64 or
    None."""
    Sq, H, _ = q.shape
    Skv = kv.shape[0]
    topk = len(idx[0]) if Sq else 0
    out = torch.zeros(Sq, H, d_v, dtype=torch.float64)
    mag = torch.zeros_like(out)
    lse = torch.full((Sq, H), INF, dtype=torch.float64)
    lse_mag = torch.zeros(Sq, H, dtype=torch.float64)
    for t in range(Sq):
        rows = dsa_active(idx[t], None if length is None else length[t], topk, Skv)
        if not rows:
            continue
        keys = kv[rows]
        s = scale * (q[t] @ keys.T)  # [H, n]
        lse_mag[t] = (abs(scale) * (q[t].abs() @ keys.abs().T)).max(dim=-1).values
        lrow = torch.logsumexp(s, dim=-1)
        big = _big_l(lrow, sink)
        p = _softmax(s)
        if sink is not None:  # exp(s - L) = softmax(s) / (1 + exp(sink - lse))
            p = p / (1.0 + torch.exp(sink - lrow))[:, None]
        p = torch.where(torch.isinf(big)[:, None] & (big[:, None] > 0), torch.zeros_like(p), p)
        out[t] = p @ keys[:, :d_v]
        mag[t] = p.abs() @ keys[:, :d_v].abs()
        lse[t] = lrow
    return out, mag, lse, lse_mag


def _sink_share(sink_h: float, big_h: float) -> float:
    if sink_h == -INF:
        return 0.0
    if sink_h == INF:
        return 1.0
    return min(math.exp(sink_h - big_h), 1.0) if not math.isnan(big_h) else float("nan")


def dsa_backward(q, kv, out, lse, dout, idx, length, sink, d_v, scale):
    """((dq, dkv, d_sink), (dq_mag, dkv_mag, d_sink_mag)) from the stored out and lse."""
    Sq, H, Dqk = q.shape
    Skv = kv.shape[0]
    topk = len(idx[0]) if Sq else 0
    dq, dkv = torch.zeros_like(q), torch.zeros_like(kv)
    mq, mkv = torch.zeros_like(q), torch.zeros_like(kv)
    d_sink = torch.zeros(H, dtype=torch.float64)
    m_sink = torch.zeros(H, dtype=torch.float64)
    a = abs(scale)
    for t in range(Sq):
        rows = dsa_active(idx[t], None if length is None else length[t], topk, Skv)
        if not rows:
            continue
        live = [h for h in range(H) if float(lse[t, h]) != INF]
        if not live:
            continue
        rt = torch.tensor(rows)
        keys = kv[rows]
        qq, oo, do = q[t, live], out[t, live], dout[t, live]
        sk = None if sink is None else sink[live]
        big = _big_l(lse[t, live], sk)
        s = scale * (qq @ keys.T)
        p = torch.exp(s - big[:, None]).clamp(max=1.0)
        p = torch.where(torch.isinf(big)[:, None] & (big[:, None] > 0), torch.zeros_like(p), p)
        delta = (oo * do).sum(-1)
        dp = do @ keys[:, :d_v].T
        ds = p * (dp - delta[:, None])
        dsm = p.abs() * ((do.abs() @ keys[:, :d_v].abs().T) + (oo * do).abs().sum(-1)[:, None])
        dq[t, live] = scale * (ds @ keys)
        mq[t, live] = a * (dsm @ keys.abs())
        dkv.index_add_(0, rt, scale * (ds.T @ qq))
        mkv.index_add_(0, rt, a * (dsm.T @ qq.abs()))
        dkv[:, :d_v].index_add_(0, rt, p.T @ do)
        mkv[:, :d_v].index_add_(0, rt, p.T.abs() @ do.abs())
        if sink is not None:
            for j, h in enumerate(live):
                share = _sink_share(float(sink[h]), float(big[j]))
                d_sink[h] -= share * float(delta[j])
                m_sink[h] += abs(share) * float((oo[j] * do[j]).abs().sum())
    return (dq, dkv, d_sink), (mq, mkv, m_sink)
